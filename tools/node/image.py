#!/usr/bin/env python3
"""Container images for the test environment's node, made without a registry or a daemon.

  image.py dockerfile FILE          the final stage's ENTRYPOINT, USER, ENV, WORKDIR, EXPOSE and
                                    COPY destinations as JSON (what the node's topk image copies)
  image.py libs ROOTFS FILE...      copy the shared libraries FILE... load (per ldd) and the
                                    dynamic loader into ROOTFS, at the same paths
  image.py pack ROOTFS OUT TAG CONFIG_JSON
                                    one-layer image of ROOTFS in `docker save` format, for
                                    `ctr images import`; CONFIG_JSON is the image's "config"

The layer is deterministic: sorted entries, owner root, mtime 0 (SOURCE_DATE_EPOCH if set).
"""

import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile


def dockerfile(path):
    """The runtime settings of the Dockerfile's last stage."""
    text = open(path, encoding="utf-8").read()
    # Join continuation lines, drop comments.
    lines = []
    for raw in re.sub(r"\\\n", " ", text).splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            lines.append(line)
    last = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    out = {"entrypoint": None, "cmd": None, "user": None, "env": {}, "workdir": None,
           "expose": [], "copies": []}
    for line in lines[last + 1:]:
        word, _, rest = line.partition(" ")
        word = word.upper()
        rest = rest.strip()
        if word in ("ENTRYPOINT", "CMD"):
            value = json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]
            out[word.lower()] = value
        elif word == "USER":
            out["user"] = rest
        elif word == "WORKDIR":
            out["workdir"] = rest
        elif word == "EXPOSE":
            out["expose"].extend(rest.split())
        elif word == "ENV":
            if "=" in rest.split()[0]:
                for pair in shlex.split(rest):
                    key, _, value = pair.partition("=")
                    out["env"][key] = value
            else:
                key, _, value = rest.partition(" ")
                out["env"][key] = value.strip()
        elif word in ("COPY", "ADD"):
            args = [a for a in shlex.split(rest) if not a.startswith("--")]
            out["copies"].append({"sources": args[:-1], "dest": args[-1]})
    return out


def libs(rootfs, files):
    """Copies what `ldd` says each file loads into rootfs, keeping the paths."""
    # Libraries the files find beside themselves (an RPATH of $ORIGIN, like the JRE's
    # libjvm.so) are already in the rootfs; ldd run on one file alone cannot see them.
    inside = {name for _, _, names in os.walk(rootfs) for name in names}
    needed = set()
    for path in files:
        result = subprocess.run(["ldd", path], capture_output=True, text=True)
        if result.returncode != 0:
            # Static executables and non-ELF files have nothing to copy.
            continue
        for line in result.stdout.splitlines():
            line = line.strip()
            if "=>" in line:
                target = line.split("=>", 1)[1].split("(")[0].strip()
                if target == "not found" and line.split("=>", 1)[0].strip() in inside:
                    continue
                if target == "not found" or not target:
                    sys.exit(f"image.py: {path} needs a library ldd cannot find: {line}")
                needed.add(target)
            elif line.startswith("/"):
                needed.add(line.split("(")[0].strip())
    for lib in sorted(needed):
        dest = os.path.join(rootfs, lib.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(os.path.realpath(lib), dest)


def layer(rootfs, mtime):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                info = tar.gettarinfo(full, arcname=os.path.relpath(full, rootfs))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = mtime
                if info.isfile():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def pack(rootfs, out, tag, config):
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    data = layer(rootfs, mtime)
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "tools/node/image.py"}],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.split(":")[1] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}]
    with tarfile.open(out, mode="w") as tar:
        for name, body in ((config_name, config_bytes), (layer_name, data),
                           ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            info.mtime = mtime
            tar.addfile(info, io.BytesIO(body))


def main(argv):
    if len(argv) >= 2 and argv[0] == "dockerfile":
        print(json.dumps(dockerfile(argv[1]), indent=2, sort_keys=True))
    elif len(argv) >= 2 and argv[0] == "libs":
        libs(argv[1], argv[2:])
    elif len(argv) == 5 and argv[0] == "pack":
        pack(argv[1], argv[2], argv[3], json.loads(argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
