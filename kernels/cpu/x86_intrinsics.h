// <immintrin.h> for the files built with AVX-512 flags. GCC 12's AVX-512 intrinsics start some
// results from _mm512_undefined_*(), which it then reports as used uninitialized once inlined
// (GCC bug 105593, fixed in 13): those warnings are silenced around the header only, not for the
// including file's own values.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
