"""Generated code for accy.launch.v1 (do not edit: scripts/gen_protos.sh regenerates it from protos/)."""
