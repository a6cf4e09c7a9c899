# Read a deck back with python-pptx and print its slide titles as JSON.
import json
import sys
from pptx import Presentation

prs = Presentation(sys.argv[1])
print(json.dumps([s.shapes.title.text if s.shapes.title is not None else
                  " ".join(sh.text_frame.text for sh in s.shapes if sh.has_text_frame) for s in prs.slides]))
