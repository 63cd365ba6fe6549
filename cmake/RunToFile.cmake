# cmake -DEXE=program -DARGS="a;b" -DOUT=file -P RunToFile.cmake
# Runs EXE ARGS and writes its standard output to OUT (build-time generation
# of documents from a program's own output); fails when the program does.
execute_process(COMMAND ${EXE} ${ARGS} OUTPUT_FILE ${OUT}.tmp RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUT}.tmp)
  message(FATAL_ERROR "${EXE} ${ARGS} failed (${rc})")
endif()
file(RENAME ${OUT}.tmp ${OUT})
