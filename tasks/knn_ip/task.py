"""Exact brute-force maximum-inner-product search: for each query in Xq [Q, 128] the k = 10 database
rows of Xb [M, 128] (fp16) with the largest q.x: indices I [Q, k] (i32) and scores Dist [Q, k] (f32,
largest first). Same inputs, reference and recall@k check (ties allowed) as tasks/knn (tasks/knn/task.py)."""
from tasks.knn.task import KnnTask


class KnnIpTask(KnnTask):
    name = "knn_ip"
    metric = "ip"


TASK = KnnIpTask()
