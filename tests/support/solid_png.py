"""Writes a solid-colour PNG of WIDTH x HEIGHT pixels to OUT (Pillow): a large image that
compresses to little, as a decompression-cost attack would send. Prints {"bytes": N}.

    solid_png.py OUT WIDTH HEIGHT
"""
import json
import os
import sys

from PIL import Image

out, w, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
Image.new("RGB", (w, h), (200, 30, 30)).save(out, compress_level=9)
print(json.dumps({"bytes": os.path.getsize(out)}))
