"""What runs inside each Ray Train worker: the plain-torch and Lightning harnesses on one TrainState
(session.py), and script/, a node's agent that supervises a torchrun script's ranks as child processes."""
