# A step that runs past its wall-clock limit.
import time

print("starting a long job", flush=True)
time.sleep(60)
