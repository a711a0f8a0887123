"""Row softmax: Y[m, :] = softmax(X[m, :]) over bf16 rows, fp32 math."""
