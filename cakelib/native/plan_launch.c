/* A launch plan's context set, pointer writes and cuLaunchKernel calls in one C call
 * (cakelib/native_launch.py): a planned small call launches one to three kernels, and through cuda.bindings
 * each launch adds the binding's argument conversion to the driver's own ~3.3 us. Built with the host C
 * compiler at the first plan and loaded with ctypes; it links nothing: the driver's cuCtxSetCurrent and
 * cuLaunchKernel come in as function pointers. */
#include <stdint.h>

typedef int (*cake_launch_fn)(void *func, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned smem, void *stream, void **params, void **extra);
typedef int (*cake_set_context_fn)(void *ctx);

/* One kernel launch: cuLaunchKernel's arguments (extra is always NULL). */
typedef struct {
  void *func;
  unsigned grid[3];
  unsigned block[3];
  unsigned smem;
  void *stream;
  void **params;
} cake_launch;

/* A plan: the driver's entry points (cuCtxSetCurrent, cuLaunchKernel), the context its launches run in,
 * the per-call pointer cells the packed params point at, the launches. */
typedef struct {
  cake_set_context_fn set_context;
  void *ctx;
  cake_launch_fn launch;
  uint64_t *cells;
  int ncells;      /* at most 4: cake_plan_run's pointer arguments */
  int nlaunches;
  cake_launch *launches;
} cake_plan;

/* Launch every kernel of the plan in order; 0, or the first failing launch's CUresult (the rest skipped). */
int cake_plan_fire(const cake_plan *p) {
  for (int i = 0; i < p->nlaunches; ++i) {
    const cake_launch *l = &p->launches[i];
    int err = p->launch(l->func, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2],
                        l->smem, l->stream, l->params, 0);
    if (err) return err;
  }
  return 0;
}

/* Make the plan's context current on this thread, write the call's pointers into the plan's cells (the
 * first ncells of a, b, c, d), then fire; 0 or the first failing call's CUresult. */
int cake_plan_run(const cake_plan *p, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t ptrs[4] = {a, b, c, d};
  int err = p->set_context(p->ctx);
  if (err) return err;
  for (int i = 0; i < p->ncells; ++i) p->cells[i] = ptrs[i];
  return cake_plan_fire(p);
}
