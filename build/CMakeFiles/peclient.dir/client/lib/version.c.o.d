CMakeFiles/peclient.dir/client/lib/version.c.o: \
 /work/main/client/lib/version.c /usr/include/stdc-predef.h \
 /work/main/client/include/peclient_version.h
