"""Generated protocol code for accy.launch (do not edit: scripts/gen_protos.sh)."""
