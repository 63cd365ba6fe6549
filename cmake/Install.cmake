# `cmake --install BUILD [--prefix P]`: what a user gets.
#   bin/dlplan, bin/dlplan-gui (when built)
#   share/dlplan/models/         the zoo's IR files (dlplan --model FILE)
#   share/doc/dlplan/            README.md and docs/
#   share/bash-completion/completions/dlplan, share/zsh/site-functions/_dlplan
#   share/man/man1/dlplan.1
# The completions and the man page are generated from the CLI's own
# definition after each build of dlplan (cli/CMakeLists.txt).
include(GNUInstallDirs)
install(TARGETS dlplan RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET dlplan-gui)
  install(TARGETS dlplan-gui RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/models/ DESTINATION ${CMAKE_INSTALL_DATADIR}/dlplan/models)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${CMAKE_BINARY_DIR}/share/dlplan.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        RENAME dlplan)
install(FILES ${CMAKE_BINARY_DIR}/share/_dlplan DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/site-functions)
install(FILES ${CMAKE_BINARY_DIR}/share/dlplan.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
