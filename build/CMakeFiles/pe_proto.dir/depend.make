# Empty dependencies file for pe_proto.
# This may be replaced when dependencies are built.
