# The service's install-time part (CMakeLists.txt, component `service`), run
# by `cmake --install`, where CMAKE_INSTALL_PREFIX is the prefix of this
# install (--prefix wins over the configured one):
#   - the unit, naming this prefix's binary and config;
#   - the config, only where there is none (an edited file stays; the
#     shipped one is <prefix>/<datadir>/pe-executord/pe-executord.conf).
# The config's directory is GNUInstallDirs' absolute SYSCONFDIR for this
# prefix: /etc for /usr and /, /etc/opt/... for /opt/..., else
# <prefix>/<sysconfdir>, so only a system prefix writes outside itself.
# In: PE_SOURCE_DIR, PE_BINARY_DIR and the GNUInstallDirs values
# PE_SBINDIR, PE_SYSCONFDIR, PE_DATADIR (relative, or absolute if so
# configured).

function(pe_install_service)
  # GNUInstallDirs' rule, applied to this prefix (no other variable of it
  # leaves the function).
  set(CMAKE_INSTALL_LIBDIR lib)
  set(CMAKE_INSTALL_SBINDIR "${PE_SBINDIR}")
  set(CMAKE_INSTALL_SYSCONFDIR "${PE_SYSCONFDIR}")
  set(CMAKE_INSTALL_DATADIR "${PE_DATADIR}")
  include(GNUInstallDirs)
  GNUInstallDirs_get_absolute_install_dir(sbindir CMAKE_INSTALL_SBINDIR SBINDIR)
  GNUInstallDirs_get_absolute_install_dir(sysconfdir CMAKE_INSTALL_SYSCONFDIR SYSCONFDIR)
  GNUInstallDirs_get_absolute_install_dir(datadir CMAKE_INSTALL_DATADIR DATADIR)
  set(conf_dir "${sysconfdir}/pe-executord")

  # The unit in the tree names a /usr install.
  file(READ "${PE_SOURCE_DIR}/systemd/pe-executord.service" unit)
  string(REPLACE "/usr/sbin/pe-executord" "${sbindir}/pe-executord" unit "${unit}")
  string(REPLACE "/etc/pe-executord/" "${conf_dir}/" unit "${unit}")
  file(WRITE "${PE_BINARY_DIR}/install-service/pe-executord.service" "${unit}")
  file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system" TYPE FILE
    FILES "${PE_BINARY_DIR}/install-service/pe-executord.service")

  # file(INSTALL) adds DESTDIR to the destination; EXISTS needs it spelled.
  if(EXISTS "$ENV{DESTDIR}${conf_dir}/pe-executord.conf")
    message(STATUS "Keeping: $ENV{DESTDIR}${conf_dir}/pe-executord.conf (it exists; the "
      "shipped one is $ENV{DESTDIR}${datadir}/pe-executord/pe-executord.conf)")
  else()
    file(INSTALL DESTINATION "${conf_dir}" TYPE FILE
      FILES "${PE_SOURCE_DIR}/conf/pe-executord.conf")
  endif()
  # file(INSTALL) lists what it installs here; install_manifest.txt reads it
  # in the caller's scope.
  set(CMAKE_INSTALL_MANIFEST_FILES "${CMAKE_INSTALL_MANIFEST_FILES}" PARENT_SCOPE)
endfunction()

pe_install_service()
