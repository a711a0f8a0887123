# Unreviewed rule proposals live here as data. The verifier never imports this package.
