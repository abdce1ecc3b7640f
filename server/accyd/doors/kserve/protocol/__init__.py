"""Generated code of the ``inference`` protocol package (``scripts/gen_protos.sh``)."""
