"""Kimi Delta Attention decode: one token per sequence, fp32 states gathered from and scattered back to
a state pool by index (fla `fused_recurrent_kda` with ssm_state_indices); both gate forms and state
layouts; rel RMSE <= 5e-3 against the float64 recurrence for o and the updated pool, NaN never.

The task is defined in tasks/kda/task.py (KdaDecodeTask, next to the prefill task it continues); this
package registers it under its own name (tasks.registry discovers task packages).
"""
from tasks.kda.task import DECODE_TASK as TASK

__all__ = ["TASK"]
