# embed.cmake - turns a file into C: `cmake -DIN=page.html -DOUT=page.c -DNAME=kt_page -P embed.cmake`
# writes OUT defining `const unsigned char NAME[]` (the bytes, then a NUL that
# NAME_len leaves out) and `const size_t NAME_len`.  CMake only: no xxd, no Python.
foreach(var IN ITEMS IN NAME OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed.cmake: -D${var}=... is required")
  endif()
endforeach()
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR len "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REPEAT "0x..," 16 line)  # CMake regexes have no {n}
string(REGEX REPLACE "(${line})" "\\1\n    " bytes "${bytes}")
get_filename_component(from "${IN}" NAME)
file(WRITE "${OUT}"
  "/* generated from ${from} by embed.cmake: do not edit */\n"
  "#include <stddef.h>\n\n"
  "extern const unsigned char ${NAME}[];\n"
  "extern const size_t ${NAME}_len;\n\n"
  "const unsigned char ${NAME}[] = {\n    ${bytes}0x00\n};\n"
  "const size_t ${NAME}_len = ${len};\n")
