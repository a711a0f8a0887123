"""KDA one-token decode with a state pool (`tasks/kda/task.py` KdaDecodeTask; docs/tasks-kda.md)."""
