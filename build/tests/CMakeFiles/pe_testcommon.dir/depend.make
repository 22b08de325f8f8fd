# Empty dependencies file for pe_testcommon.
# This may be replaced when dependencies are built.
