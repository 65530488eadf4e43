"""NVIDIA Dynamo in front of the CPU rehearsal: worker.py (one worker process), server.py (`serve --engine dynamo`)."""
