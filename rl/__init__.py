"""Tasks, rollouts, teacher feedback, losses and the DeepSpeed trainer."""
