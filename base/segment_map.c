#include "base/segment_map.h"
/* The map itself; see segment_map.h. */
_Atomic uint8_t lull_segment_map[LULL_SEGMAP_ENTRIES];

_Atomic uint64_t lull_aligned_huge_map[LULL_SEGMAP_WORDS];
