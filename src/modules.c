/* The modules that start with lull, in start order. Each registers its
 * hooks (start, fork, exit) with lull_register_module(). */
#include "src/init.h"

void lull_modules_register_all(void);

void lull_modules_register_all(void) {}
