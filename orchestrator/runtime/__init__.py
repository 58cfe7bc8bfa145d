"""What runs inside each Ray Train worker: the plain-torch and Lightning harnesses on one TrainState."""
