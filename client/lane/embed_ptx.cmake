# cmake -DIN=kernel.ptx -DOUT=kernel_ptx.cc -DNAME=symbol -P embed_ptx.cmake: the PTX text as a
# C++ string constant `extern const char NAME[]` (client/CMakeLists.txt, the lane's copy kernel).
file(READ "${IN}" ptx)
file(WRITE "${OUT}" "// Generated from ${IN} by embed_ptx.cmake.\nextern const char ${NAME}[];\nconst char ${NAME}[] = R\"dh_ptx(${ptx})dh_ptx\";\n")
