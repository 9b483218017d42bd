/* What the guest program needs of lull's core when it is built from the
 * numa/ sources alone (no liblull.a): the configuration that
 * base/message.c reads. Weak, so a linked liblull.a's definition wins. */
#include "base/config.h"

__attribute__((weak)) lull_config_t lull_config;
