"""Seed programs for maximum-inner-product kNN (the generator lives in tasks/knn/programs.py)."""
from tasks.base import signature_defaults
from tasks.knn.programs import knn_fused

SEEDS = {"knn_ip_mma_sm80": lambda: knn_fused("ip")}

FAMILIES = {
    "knn_ip_mma_sm80": {
        "make": knn_fused,
        "defaults": {**signature_defaults(knn_fused), "metric": "ip"},
        "space": {"bq": [32, 64, 128], "bn": [32, 64, 128]},
        "check": lambda p: p["bq"] % 16 == 0 and p["bn"] % 16 == 0,
        "tactics": {"retile": ["bq", "bn"]},
    },
}
