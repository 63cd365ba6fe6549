# ctest build.install: installs BUILD into PREFIX and checks what a user gets.
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD} --prefix ${PREFIX} OUTPUT_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()

set(expected bin/dlplan share/dlplan/models/gpt2.json share/dlplan/models/vit-b16.json share/doc/dlplan/README.md
    share/doc/dlplan/memory.md share/doc/dlplan/cluster.md share/bash-completion/completions/dlplan
    share/zsh/site-functions/_dlplan share/man/man1/dlplan.1)
if(GUI)
  list(APPEND expected bin/dlplan-gui)
endif()
foreach(f ${expected})
  if(NOT EXISTS ${PREFIX}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

function(run out_var)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${PREFIX} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${ARGN} failed (${rc}):\n${out}${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

function(expect text what where)
  string(FIND "${text}" "${what}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected '${what}' in ${where}:\n${text}")
  endif()
endfunction()

# The installed dlplan runs from anywhere and plans an installed zoo file.
run(out ${PREFIX}/bin/dlplan --version)
expect("${out}" "dlplan " "dlplan --version")
run(out ${PREFIX}/bin/dlplan --model ${PREFIX}/share/dlplan/models/tiny-gpt.json --format json)
expect("${out}" "\"kind\": \"planning\"" "the planning of an installed model file")

# The man page is the CLI's own help: every plan flag is in it.
file(READ ${PREFIX}/share/man/man1/dlplan.1 man)
expect("${man}" ".TH DLPLAN 1" "dlplan.1")
foreach(flag micro\\-batch global\\-batch seq\\-len warmup\\-steps betas syncbn\\-group)
  expect("${man}" "\\-\\-${flag}" "dlplan.1")
endforeach()
find_program(MAN man)
if(MAN)
  execute_process(COMMAND ${MAN} -l ${PREFIX}/share/man/man1/dlplan.1 OUTPUT_VARIABLE rendered ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "man -l dlplan.1 failed: ${err}")
  endif()
endif()

# bash loads the completion and completes a flag and its values.
find_program(BASH bash)
if(BASH)
  run(out ${BASH} -c "source ${PREFIX}/share/bash-completion/completions/dlplan && complete -p dlplan && \
COMP_WORDS=(dlplan plan --micro) && COMP_CWORD=2 && _dlplan && echo \"\${COMPREPLY[*]}\" && \
COMP_WORDS=(dlplan --model gpt2 --strategy '') && COMP_CWORD=4 && _dlplan && echo \"\${COMPREPLY[*]}\"")
  expect("${out}" "complete -F _dlplan dlplan" "bash completion")
  expect("${out}" "--micro-batch" "bash completion of --micro")
  expect("${out}" "zero1 zero2 zero3" "bash completion of --strategy")
endif()
file(READ ${PREFIX}/share/zsh/site-functions/_dlplan zsh)
expect("${zsh}" "#compdef dlplan" "_dlplan")
expect("${zsh}" "--micro-batch" "_dlplan")
find_program(ZSH zsh)
if(ZSH)
  run(out ${ZSH} -n ${PREFIX}/share/zsh/site-functions/_dlplan)
endif()
file(REMOVE_RECURSE ${PREFIX})
message(STATUS "install tree complete")
