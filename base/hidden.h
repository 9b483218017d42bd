/* LULL_HIDDEN, for the declarations of lull's own global variables. The
 * library is built with -fvisibility=hidden, but that covers definitions:
 * a plain `extern` declaration is taken for a symbol that may live in
 * another object, read through the GOT (an address load the linker turns
 * into a `lea`, then the load itself). Declared hidden, a read is one
 * instruction with the variable as its operand (the remote free's fast
 * path reads two: 2 of its instructions, callgrind). */
#ifndef LULL_HIDDEN_H
#define LULL_HIDDEN_H

#define LULL_HIDDEN __attribute__((visibility("hidden")))

#endif
