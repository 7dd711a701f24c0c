"""One-off experiments: questions about the model or its training answered with figures, not gates."""
