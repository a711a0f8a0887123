"""One Lloyd iteration of k-means (fused assignment + per-CTA aggregated update)."""
