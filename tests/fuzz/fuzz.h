/* fuzz.h — shared bits of the libFuzzer drivers (tests/fuzz/README.md).
 * FUZZ_CHECK is an assertion that survives -DNDEBUG: a property that does
 * not hold aborts, and libFuzzer saves the input that broke it. */
#ifndef CONCH_FUZZ_H
#define CONCH_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(c)                                                          \
  do {                                                                         \
    if (!(c)) {                                                                \
      fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #c); \
      abort();                                                                 \
    }                                                                          \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
