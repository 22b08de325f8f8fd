# Empty compiler generated dependencies file for pe.
# This may be replaced when dependencies are built.
