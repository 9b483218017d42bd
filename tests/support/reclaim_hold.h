/* Holding lull's reclaim thread inside its tick, so that nothing purges,
 * arms, registers or scans while a test looks at (or changes) the state the
 * thread would otherwise move.
 *
 * The first reclaim_hold() chains a hook on lull_reclaim_tick_hook (the
 * counter page's hook, if any, still runs first): when a hold is asked for,
 * the reclaim thread waits at the end of a tick until it is released. The
 * hook stays installed for the life of the process and does nothing while
 * no hold is asked for.
 *
 * Never call lull_reclaim_now() while the thread is held: it waits for a
 * tick that cannot come. Usable from any thread but one at a time, and in
 * a child before Criterion starts (no Criterion calls here). */
#ifndef LULL_TEST_RECLAIM_HOLD_H
#define LULL_TEST_RECLAIM_HOLD_H

#include <stdbool.h>

/* Asks the reclaim thread to stop at the end of its current or next tick
 * and waits (up to 20 s) until it does: true once it is held. */
bool reclaim_hold(void);

/* Lets it go on and waits (up to 20 s) until it has left the hook: true
 * once it is no longer held. */
bool reclaim_release(void);

/* Whether the reclaim thread is waiting in the hook now. */
bool reclaim_held(void);

#endif
