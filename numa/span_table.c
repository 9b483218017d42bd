/* The run's span table (numa/span_table.h). */
#include "numa/span_table.h"

lull_span *lull_run_spans[LULL_RUN_SLICES];

void lull_span_table_init_segment(lull_segment *s) {
    lull_span **run = lull_run_spans_of(s);
    if (!run) return;
    /* span_head is zero in fresh memory: written here, it would only
     * dirty a page of the header */
    lull_span *none = lull_span_table_of(s)->slices;
    for (unsigned i = 0; i < LULL_SLICES; i++)
        run[i] = none;
}
