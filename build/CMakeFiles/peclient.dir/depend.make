# Empty dependencies file for peclient.
# This may be replaced when dependencies are built.
