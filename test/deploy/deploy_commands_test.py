#!/usr/bin/python3
"""Every command line in deploy/ starts and serves gRPC health (issue 37).

Reads the command lines of deploy/: Kubernetes `command:`/`args:` (a
container without `command:` runs its image's ENTRYPOINT, found in the
Dockerfile whose header builds that image), systemd `ExecStart=` and
Dockerfile `ENTRYPOINT`/`CMD`. Each is started here as it is written, with
only what cannot exist on a test machine substituted, and every
substitution printed:

  - the binary: its path in the image or on the host (/usr/local/bin/X) is
    mapped to the build directory through the Dockerfile's `COPY --from=build
    /src/build-image/<path>` or the unit's `install ... build/<path>` line;
  - addresses: every host:port becomes 127.0.0.1 and a free port (the same
    address the same port within one command), a --host/store_host 127.0.0.1,
    and Kubernetes' $(VAR) from the container's env (spec.nodeName, status.podIP);
  - paths: each command gets a root directory R standing for its file system;
    an absolute path P becomes R/P. R is filled as the deployment fills it:
    Kubernetes volumes (ConfigMaps with the data of the ConfigMap in the same
    kustomization, Secrets with a self-signed certificate, its key and a
    token, emptyDir and PersistentVolumeClaims as empty directories), the
    unit's `install` lines and StateDirectory=, the Dockerfile's `mkdir -p`.
    Settings files put there (YAML/JSON) get the same address and path
    substitutions;
  - GPUs: an arachne-agent asked for N GPUs (nvidia.com/gpu, else 1) gets
    --virtual-gpus N where this machine has no CUDA GPU for it;
  - a container with readOnlyRootFilesystem gets an unwritable TMPDIR unless
    a volume is mounted at /tmp (files the binary writes must be on volumes).

Then it checks that grpc.health.v1.Health/Check answers SERVING on the
command's listen address (over TLS with the test certificate when the command
serves TLS) and on its health_listen address when it has one, sends SIGTERM
and expects exit code 0. Commands run side by side, so the whole test takes
about as long as the slowest one.

Static checks of the image recipes (Docker is not used): each image a
manifest runs is built by a Dockerfile here and holds the binaries its
commands name; the roles' build options (controller and agent with LibTorch,
the agent's CUDA and NCCL on exactly when the base image has
/usr/local/cuda, whose libraries it carries into the runtime image); and,
on Debian with a local build, each binary's shared libraries come from a
package the runtime stage installs (or one those depend on, or a required
one).

usage: deploy_commands_test.py --source-dir DIR --build-dir DIR
Exit 0: all passed; 1: a failure (each names file, line and command).
"""

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HEALTH_TIMEOUT_S = 40.0   # start to SERVING, per command (side by side); an
                          # agent of 8 CPU ranks starts 8 engines: ~14 s on 2 busy cores
STOP_TIMEOUT_S = 15.0     # SIGTERM to exit
CA = None                 # (cert, key) paths of the test certificate

failures = []
notes = []


def fail(where, cmd, why):
    failures.append(f"{where}: {why}\n    command: {cmd}")


# --------------------------------------------------------------------------
# A YAML subset: block mappings and sequences, flow [..]/{..} of scalars,
# block scalars (| and >), comments. Enough for Kubernetes manifests.

class Map(dict):
    def __init__(self):
        super().__init__()
        self.lines = {}


KEY_RE = re.compile(r'^("[^"]*"|\'[^\']*\'|[^\s\'"#\-][^:#]*?|-[^\s:][^:#]*?):(\s+|$)')


def strip_comment(s):
    out, q = [], None
    for i, c in enumerate(s):
        if q:
            if c == q:
                q = None
        elif c in '"\'' and (i == 0 or s[i - 1] in ' [{,:'):
            q = c
        elif c == '#' and (i == 0 or s[i - 1] in ' \t'):
            break
        out.append(c)
    return ''.join(out).rstrip()


def scalar(s):
    s = s.strip()
    if s.startswith('[') or s.startswith('{'):
        try:
            return json.loads(s)
        except ValueError:
            inner = s[1:-1].strip()
            if not inner:
                return [] if s[0] == '[' else {}
            parts = [p.strip() for p in inner.split(',')]
            if s[0] == '[':
                return [scalar(p) for p in parts]
            m = {}
            for p in parts:
                k, _, v = p.partition(':')
                m[k.strip()] = scalar(v)
            return m
    if len(s) >= 2 and s[0] == s[-1] and s[0] in '"\'':
        return s[1:-1]
    if s in ('true', 'false'):
        return s == 'true'
    if re.fullmatch(r'-?\d+', s):
        return int(s)
    return s


class Yaml:
    def __init__(self, text):
        self.lines = text.split('\n')
        self.i = 0

    @staticmethod
    def indent(line):
        return len(line) - len(line.lstrip(' '))

    def skip(self):
        while self.i < len(self.lines):
            s = self.lines[self.i].strip()
            if s and not s.startswith('#') and s != '---':
                return True
            self.i += 1
        return False

    def node(self, min_indent):
        if not self.skip():
            return None
        line = self.lines[self.i]
        ind = self.indent(line)
        if ind < min_indent:
            return None
        if line.strip().startswith('- ') or line.strip() == '-':
            return self.seq(ind)
        return self.map(ind)

    def child(self, ind):
        if not self.skip():
            return None
        line = self.lines[self.i]
        cur = self.indent(line)
        if cur > ind:
            return self.node(cur)
        if cur == ind and (line.strip().startswith('- ') or line.strip() == '-'):
            return self.seq(ind)
        return None

    def block_scalar(self, ind, style):
        out = []
        self.i += 1
        block_ind = None
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if line.strip() == '':
                out.append('')
                self.i += 1
                continue
            cur = self.indent(line)
            if cur <= ind:
                break
            if block_ind is None:
                block_ind = cur
            out.append(line[block_ind:])
            self.i += 1
        while out and out[-1] == '':
            out.pop()
        return '\n'.join(out) + ('\n' if style.startswith('|') else '')

    def map(self, ind):
        m = Map()
        while self.skip():
            line = self.lines[self.i]
            if self.indent(line) != ind:
                break
            content = strip_comment(line.strip())
            if content.startswith('- '):
                break
            k = KEY_RE.match(content)
            if not k:
                raise ValueError(f'line {self.i + 1}: not a mapping entry: {line!r}')
            key = scalar(k.group(1))
            rest = content[k.end():].strip()
            m.lines[key] = self.i + 1
            if rest in ('|', '|-', '|+', '>', '>-', '>+'):
                m[key] = self.block_scalar(ind, rest)
                continue
            self.i += 1
            m[key] = self.child(ind) if rest == '' else scalar(rest)
        return m

    def seq(self, ind):
        out = []
        while self.skip():
            line = self.lines[self.i]
            if self.indent(line) != ind:
                break
            stripped = line.strip()
            if not (stripped.startswith('- ') or stripped == '-'):
                break
            after = line[ind + 1:]
            if after.strip() == '':
                self.i += 1
                out.append(self.child(ind))
            elif KEY_RE.match(strip_comment(after.strip())):
                self.lines[self.i] = ' ' * (ind + 1) + after
                out.append(self.map(self.indent(self.lines[self.i])))
            else:
                out.append(scalar(strip_comment(after.strip())))
                self.i += 1
        return out


def parse_yaml(text):
    return Yaml(text).node(0)


# --------------------------------------------------------------------------
# Files and the build

def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def make_tls(tmp):
    cert, key = os.path.join(tmp, 'test.crt'), os.path.join(tmp, 'test.key')
    if not shutil.which('openssl'):
        return None
    r = subprocess.run(
        ['openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
         '-keyout', key, '-out', cert, '-subj', '/CN=localhost',
         '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1'],
        capture_output=True, text=True)
    if r.returncode != 0:
        notes.append('openssl could not make a test certificate: ' + r.stderr.strip())
        return None
    return cert, key


def cuda_gpu_here(agent_binary):
    """True when this machine has a CUDA GPU the agent would count."""
    if not os.path.exists('/dev/nvidia0'):
        return False
    r = subprocess.run(['ldd', agent_binary], capture_output=True, text=True)
    return 'libcudart' in r.stdout


ADDR_RE = re.compile(r'^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.\-$()]+):(\d+)$')
HOST_KEYS = {'host', 'store_host', 'store-host'}


class Command:
    """One command line of deploy/, with the world it runs in."""

    def __init__(self, where, argv, kind, tmp, name):
        self.where = where          # "deploy/x.yaml:12"
        self.argv = list(argv)      # as written (after $(VAR) expansion)
        self.kind = kind            # 'kubernetes' | 'systemd' | 'docker'
        self.root = os.path.join(tmp, name, 'root')
        os.makedirs(self.root)
        self.ports = {}
        self.binaries = {}          # path as written -> build path
        self.env = {}
        self.gpus = None            # GPUs asked for (agent)
        self.read_only_root = False
        self.tmp_mounted = False
        self.subs = []              # substitutions, printed
        self.skip = None            # reason not to run
        self.proc = None
        self.started = None
        self.stopping = None        # when SIGTERM was sent
        self.served = False
        self.log = os.path.join(tmp, name, 'log')

    def shown(self):
        return ' '.join(shlex.quote(a) for a in self.argv)

    def path(self, p):
        return os.path.join(self.root, p.lstrip('/'))

    def addr(self, v):
        m = ADDR_RE.match(v)
        if not m:
            return None
        if v not in self.ports:
            self.ports[v] = free_port()
        return f'127.0.0.1:{self.ports[v]}'

    def value(self, key, v):
        """The substitute of a flag's or setting's value."""
        if key in HOST_KEYS:
            return '127.0.0.1'
        a = self.addr(v)
        if a:
            return a
        if v.startswith('/'):
            return self.path(v)
        return v

    def put(self, dest, text=None, src=None):
        p = self.path(dest)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if src is not None:
            shutil.copyfile(src, p)
        else:
            with open(p, 'w') as f:
                f.write(text)
        return p

    def rewrite_settings_files(self):
        """Address and path substitutions in the YAML/JSON files under R."""
        line_re = re.compile(r'^(\s*(?:-\s+)?)([A-Za-z_][\w.\-]*)(:\s+)([^\s#{}\[\]]+)(.*)$')
        for d, _, files in os.walk(self.root):
            for fn in files:
                if not fn.endswith(('.yaml', '.yml', '.json')):
                    continue
                p = os.path.join(d, fn)
                with open(p) as f:
                    lines = f.read().split('\n')
                out = []
                for line in lines:
                    m = line_re.match(line)
                    if m and not line.lstrip().startswith('#'):
                        raw = m.group(4)
                        q = raw[0] if raw[:1] in '"\'' and raw[-1:] == raw[:1] else ''
                        v = raw[1:-1] if q else raw
                        nv = self.value(m.group(2), v)
                        if nv != v:
                            line = m.group(1) + m.group(2) + m.group(3) + q + nv + q + m.group(5)
                    out.append(line)
                with open(p, 'w') as f:
                    f.write('\n'.join(out))

    def final_argv(self):
        """argv with the binary, address, path and GPU substitutions."""
        argv = [self.binaries.get(self.argv[0], self.argv[0])]
        if argv[0] == self.argv[0]:
            self.skip = ('no build output for ' + self.argv[0] +
                         ' (not copied into the image / installed by the unit)')
        key = None
        for a in self.argv[1:]:
            if a.startswith('--') and '=' in a:
                k, _, v = a.partition('=')
                argv.append(k + '=' + self.value(k[2:], v))
                key = None
            elif a.startswith('--'):
                argv.append(a)
                key = a[2:]
            elif key is not None:
                argv.append(self.value(key, a))
                key = None
            else:
                argv.append(self.value('', a))
        self.rewrite_settings_files()
        if os.path.basename(argv[0]) == 'arachne-agent':
            config = self.setting(argv, 'config')
            has_virtual = any(a.split('=')[0] == '--virtual-gpus' for a in argv) or (
                config and re.search(r'^virtual_gpus:', read(config), re.M))
            if not has_virtual and not cuda_gpu_here(argv[0]):
                n = self.gpus or 1
                argv += ['--virtual-gpus', str(n)]
                self.subs.append(f'--virtual-gpus {n} (no CUDA GPU here; {n} asked for)')
        return argv

    @staticmethod
    def setting(argv, name, config_key=None):
        """A flag's value in argv, else the config file's setting."""
        for i, a in enumerate(argv):
            if a == '--' + name and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith('--' + name + '='):
                return a.split('=', 1)[1]
        if config_key:
            config = Command.setting(argv, 'config')
            if config and os.path.exists(config):
                m = re.search(r'^' + config_key + r':\s*("?)([^\s"#]+)\1', read(config), re.M)
                if m:
                    return m.group(2)
        return None


def read(p):
    with open(p) as f:
        return f.read()


def fill_secret(cmd, mount, volume):
    """A Secret's files: certificates, keys and tokens by their key names."""
    sec = volume['secret']
    items = sec.get('items')
    name = sec.get('secretName', '')
    if items:
        keys = [(i['key'], i['path']) for i in items]
    elif 'tls' in name:
        keys = [(k, k) for k in ('tls.crt', 'tls.key', 'ca.crt')]
    else:
        keys = [('token', 'token')]
    for key, path in keys:
        dest = mount.rstrip('/') + '/' + path
        if key.endswith(('.crt', '.pem')):
            if CA is None:
                cmd.skip = f'needs TLS ({dest}) and openssl is missing'
                return
            cmd.put(dest, src=CA[0])
        elif key.endswith('.key'):
            if CA is None:
                cmd.skip = f'needs TLS ({dest}) and openssl is missing'
                return
            cmd.put(dest, src=CA[1])
        else:
            cmd.put(dest, 'deploy-test-token-0123456789abcdef\n')
    cmd.subs.append(f'Secret {name} at {mount}: test ' + ', '.join(p for _, p in keys))


# --------------------------------------------------------------------------
# Dockerfiles

class Dockerfile:
    def __init__(self, path, rel):
        self.rel = rel
        self.stages = []        # [{'from', 'name', 'run': [(line, text)], 'copy': [...]}]
        self.args = {}
        self.entrypoint = None  # (line, argv)
        self.cmd = None
        self.images = set()     # image names its header builds (-t NAME)
        text = read(path)
        for m in re.finditer(r'docker build -f deploy/(\S+).*?-t (\S+)', text.replace('\\\n#', ' ')):
            if m.group(1) == os.path.basename(rel):
                self.images.add(m.group(2))
        logical, start, buf = [], None, ''
        for n, line in enumerate(text.split('\n'), 1):
            if not buf and (not line.strip() or line.lstrip().startswith('#')):
                continue
            if not buf:
                start = n
            if line.rstrip().endswith('\\'):
                buf += line.rstrip()[:-1] + ' '
                continue
            buf += line
            logical.append((start, buf.strip()))
            buf = ''
        for n, ins in logical:
            op, _, rest = ins.partition(' ')
            op = op.upper()
            if op == 'ARG':
                k, _, v = rest.partition('=')
                self.args[k] = v
            elif op == 'FROM':
                parts = rest.split()
                base = re.sub(r'\$\{(\w+)\}', lambda m: self.args.get(m.group(1), ''), parts[0])
                name = parts[2] if len(parts) >= 3 and parts[1].upper() == 'AS' else None
                self.stages.append({'from': base, 'from_raw': parts[0], 'name': name,
                                    'run': [], 'copy': [], 'line': n})
            elif op == 'RUN':
                self.stages[-1]['run'].append((n, rest))
            elif op == 'COPY':
                self.stages[-1]['copy'].append((n, rest))
            elif op in ('ENTRYPOINT', 'CMD'):
                v = json.loads(rest) if rest.startswith('[') else ['/bin/sh', '-c', rest]
                setattr(self, op.lower(), (n, v))

    def binaries(self, build_dir):
        """/usr/local/bin/X -> build path, from the final stage's COPY lines."""
        out = {}
        for _, rest in self.stages[-1]['copy']:
            parts = rest.split()
            if not parts[0].startswith('--from='):
                continue
            srcs, dest = parts[1:-1], parts[-1]
            for s in srcs:
                m = re.match(r'/src/build-image/(.+)$', s)
                if m and dest.endswith('/'):
                    out[dest + os.path.basename(s)] = os.path.join(build_dir, m.group(1))
        return out

    def build_options(self):
        opts = {}
        for _, run in self.stages[0]['run']:
            for m in re.finditer(r'-D(ARACHNE_WITH_\w+)=(\S+)', run):
                opts[m.group(1)] = m.group(2)
        return opts

    def apt_packages(self):
        pkgs = set()
        for _, run in self.stages[-1]['run']:
            m = re.search(r'apt-get install ([^&]*)', run)
            if m:
                pkgs |= {w for w in m.group(1).split() if not w.startswith('-')}
        return pkgs


def check_dockerfile_roles(dockerfiles, build_dir):
    for df in dockerfiles:
        bins = {os.path.basename(b) for b in df.binaries(build_dir)}
        opts = df.build_options()
        where = f'deploy/{df.rel}:{df.stages[0]["line"]}'
        run = ' '.join(r for _, r in df.stages[0]['run'])
        if {'arachne-controller', 'arachne-agent'} & bins and opts.get('ARACHNE_WITH_TORCH') != 'ON':
            fail(where, 'FROM ' + df.stages[0]['from_raw'],
                 'builds the controller or agent, which CMake builds only with '
                 'LibTorch, but ARACHNE_WITH_TORCH is ' + str(opts.get('ARACHNE_WITH_TORCH')))
        if 'arachne-agent' in bins:
            cuda, nccl = opts.get('ARACHNE_WITH_CUDA'), opts.get('ARACHNE_WITH_NCCL')
            var = re.match(r'^\$\{?(\w+)\}?$', cuda or '')
            ok = (var and nccl == cuda and
                  re.search(r'if \[ -[de] /usr/local/cuda \]; then ' + var.group(1) +
                            r'=ON; else ' + var.group(1) + '=OFF; fi', run))
            if not ok:
                fail(where, 'FROM ' + df.stages[0]['from_raw'],
                     'the agent image must build with CUDA and NCCL on exactly when '
                     'the base image has /usr/local/cuda, got ARACHNE_WITH_CUDA='
                     f'{cuda} ARACHNE_WITH_NCCL={nccl}')
            elif not (re.search(r'libcudart', run) and re.search(r'libnccl', run) and
                      any('/out/lib' in c for _, c in df.stages[-1]['copy'])):
                fail(where, 'FROM ' + df.stages[0]['from_raw'],
                     'a CUDA build of the agent needs libcudart and libnccl in the '
                     'runtime image: none are collected and copied')
            else:
                notes.append(f'deploy/{df.rel}: agent with CUDA and NCCL when the base '
                             f'({df.stages[0]["from"]} by default) has /usr/local/cuda')
        elif bins & {'arachne-controller', 'arachne-planner'}:
            notes.append(f'deploy/{df.rel}: ' + ', '.join(sorted(bins)) + ' with ' +
                         ' '.join(f'{k[13:]}={v}' for k, v in sorted(opts.items())))


def check_runtime_libraries(dockerfiles, build_dir):
    """Each binary's NEEDED libraries come from an installed package."""
    if not (shutil.which('dpkg-query') and shutil.which('readelf') and
            'bookworm' in read('/etc/os-release')):
        notes.append('runtime libraries not checked: needs Debian 12 with dpkg and readelf')
        return
    status = subprocess.run(
        ['dpkg-query', '-W', '-f=${Package}\t${Priority}\t${Pre-Depends}, ${Depends}\n'],
        capture_output=True, text=True).stdout
    deps, required = {}, set()
    for line in status.splitlines():
        pkg, prio, d = line.split('\t')
        deps[pkg] = {re.split(r'[\s:(]', alt.strip())[0]
                     for dep in d.split(',') for alt in dep.split('|')[:1] if alt.strip()}
        if prio == 'required':
            required.add(pkg)
    found = []   # (df, dest, lib, candidate paths) of every NEEDED library
    for df in dockerfiles:
        for dest, binary in sorted(df.binaries(build_dir).items()):
            if not os.path.exists(binary):
                notes.append(f'deploy/{df.rel}: {binary} not built, libraries not checked')
                continue
            needed = re.findall(r'\(NEEDED\)\s+Shared library: \[(.+?)\]',
                                subprocess.run(['readelf', '-d', binary], capture_output=True,
                                               text=True).stdout)
            where = {}
            for line in subprocess.run(['ldd', binary], capture_output=True,
                                       text=True).stdout.splitlines():
                m = re.match(r'\s*(\S+) => (/\S+)', line)
                if m:
                    where[m.group(1)] = m.group(2)
            for lib in needed:
                path = where.get(lib)
                if re.match(r'lib(cudart|nccl|cuda)\b', lib) or (path or '').startswith('/usr/local/'):
                    # CUDA and NCCL: not linked in an image built without
                    # them; carried by the agent's library copy (checked
                    # above) in one built with them.
                    continue
                cands = []
                if path:
                    for p in (path, os.path.realpath(path)):
                        cands += [p, re.sub(r'^/usr/lib/', '/lib/', p), re.sub(r'^/lib/', '/usr/lib/', p)]
                found.append((df, dest, lib, list(dict.fromkeys(cands))))
    paths = sorted({c for *_, cands in found for c in cands})
    owners = {}
    out = subprocess.run(['dpkg', '-S'] + paths, capture_output=True, text=True).stdout if paths else ''
    for line in out.splitlines():
        pkgs, _, path = line.partition(': ')
        owners.setdefault(path.strip(), set()).update(
            p.strip().split(':')[0] for p in pkgs.split(','))
    missing = {}
    closures = {}
    for df, dest, lib, cands in found:
        if df.rel not in closures:
            closure, todo = set(), list(df.apt_packages())
            while todo:
                p = todo.pop()
                if p not in closure:
                    closure.add(p)
                    todo.extend(deps.get(p, ()))
            closures[df.rel] = closure | required
        pkgs = set().union(*(owners.get(c, set()) for c in cands)) if cands else set()
        if not cands:
            missing.setdefault((df, dest), []).append(f'{lib} (not found here)')
        elif not pkgs & closures[df.rel]:
            missing.setdefault((df, dest), []).append(
                f'{lib} (package {", ".join(sorted(pkgs)) or "unknown"})')
    for (df, dest), libs in missing.items():
        line = df.stages[-1]['run'][0][0] if df.stages[-1]['run'] else df.stages[-1]['line']
        fail(f'deploy/{df.rel}:{line}', 'apt-get install ' + ' '.join(sorted(df.apt_packages())),
             f'{dest} loads libraries the runtime stage does not install: ' + '; '.join(libs))
    if found:
        notes.append(f'runtime libraries: {len(found)} (binary, library) pairs of '
                     f'{len({(d.rel, b) for d, b, *_ in found})} image binaries checked '
                     'against the runtime stages\' packages')


# --------------------------------------------------------------------------
# Kubernetes

def kubernetes_commands(src, build_dir, dockerfiles, tmp):
    cmds = []
    images = {}
    for df in dockerfiles:
        for im in df.images:
            images[im] = df
    for kust in sorted(glob_files(os.path.join(src, 'deploy'), 'kustomization.yaml')):
        d = os.path.dirname(kust)
        docs = []
        for r in parse_yaml(read(kust)).get('resources', []):
            p = os.path.join(d, r)
            docs.append((os.path.relpath(p, src), parse_yaml(read(p))))
        configmaps = {doc['metadata']['name']: doc.get('data') or {}
                      for _, doc in docs if doc.get('kind') == 'ConfigMap'}
        for rel, doc in docs:
            spec = doc.get('spec', {})
            pod = (spec.get('template') or {}).get('spec')
            if not pod:
                continue
            claims = {c['metadata']['name'] for c in spec.get('volumeClaimTemplates', [])}
            volumes = {v['name']: v for v in pod.get('volumes', [])}
            for c in pod.get('containers', []):
                line = c.lines.get('command', c.lines.get('args', c.lines.get('name')))
                where = f'{rel}:{line}'
                df = images.get(c.get('image'))
                if df is None:
                    fail(where, str(c.get('command', '')) + ' ' + str(c.get('args', '')),
                         f'image {c.get("image")} is built by no Dockerfile in deploy/ '
                         '(its header: docker build -f deploy/<file> ... -t <image>)')
                    continue
                if 'command' in c:
                    argv = list(c['command'])
                else:
                    if df.entrypoint is None:
                        fail(where, str(c.get('args')), f'no command and image {c["image"]} '
                             f'(deploy/{df.rel}) has no ENTRYPOINT')
                        continue
                    argv = list(df.entrypoint[1])
                argv += [str(a) for a in c.get('args', [])]
                env = {}
                for e in c.get('env', []):
                    if 'value' in e:
                        env[e['name']] = str(e['value'])
                    else:
                        field = e['valueFrom']['fieldRef']['fieldPath']
                        env[e['name']] = {'spec.nodeName': 'deploy-test-node',
                                          'status.podIP': '127.0.0.1'}.get(field, field)
                argv = [re.sub(r'\$\((\w+)\)', lambda m: env.get(m.group(1), m.group(0)), a)
                        for a in argv]
                cmd = Command(where, argv, 'kubernetes', tmp, f'k8s-{len(cmds)}')
                cmd.env = env
                cmd.binaries = df.binaries(build_dir)
                if env:
                    cmd.subs.append('env ' + ' '.join(f'{k}={v}' for k, v in env.items()))
                limits = (c.get('resources') or {}).get('limits') or {}
                if 'nvidia.com/gpu' in limits:
                    cmd.gpus = int(limits['nvidia.com/gpu'])
                cmd.read_only_root = bool((c.get('securityContext') or {}).get('readOnlyRootFilesystem'))
                for m in c.get('volumeMounts', []):
                    mount = m['mountPath']
                    if mount.rstrip('/') == '/tmp':
                        cmd.tmp_mounted = True
                    v = volumes.get(m['name'])
                    if v is None and m['name'] in claims:
                        os.makedirs(cmd.path(mount), exist_ok=True)
                        cmd.subs.append(f'PersistentVolumeClaim {m["name"]} at {mount}: empty directory')
                    elif v is None:
                        fail(where, cmd.shown(), f'volumeMount {m["name"]} names no volume')
                    elif 'configMap' in v:
                        name = v['configMap']['name']
                        data = configmaps.get(name)
                        if data is None and not v['configMap'].get('optional'):
                            fail(where, cmd.shown(), f'ConfigMap {name} is not in {kust}')
                            continue
                        os.makedirs(cmd.path(mount), exist_ok=True)
                        for k, text in (data or {}).items():
                            cmd.put(mount.rstrip('/') + '/' + k, text)
                        cmd.subs.append(f'ConfigMap {name} at {mount}')
                    elif 'secret' in v:
                        fill_secret(cmd, mount, v)
                    else:
                        os.makedirs(cmd.path(mount), exist_ok=True)
                        cmd.subs.append(f'{next(iter(k for k in v if k != "name"))} {m["name"]} '
                                        f'at {mount}: empty directory')
                cmds.append(cmd)
    return cmds


def glob_files(top, name):
    for d, _, files in os.walk(top):
        if name in files:
            yield os.path.join(d, name)


# --------------------------------------------------------------------------
# systemd

def systemd_commands(src, build_dir, tmp):
    cmds = []
    for d, _, files in os.walk(os.path.join(src, 'deploy')):
        for fn in sorted(files):
            if not fn.endswith('.service'):
                continue
            p = os.path.join(d, fn)
            rel = os.path.relpath(p, src)
            text = read(p)
            installs = []
            for m in re.finditer(r'^#\s+(?:sudo )?install (.+)$', text, re.M):
                words = [w for w in shlex.split(m.group(1).split('#')[0])]
                args, i = [], 0
                while i < len(words):
                    if words[i] == '-m':
                        i += 2
                        continue
                    if words[i].startswith('-'):
                        i += 1
                        continue
                    args.append(words[i])
                    i += 1
                installs.append((args[:-1], args[-1]))
            state = re.findall(r'^StateDirectory=(\S+)', text, re.M)
            lines = text.split('\n')
            n = 0
            while n < len(lines):
                line = lines[n]
                start = n + 1
                while line.rstrip().endswith('\\') and n + 1 < len(lines):
                    n += 1
                    line = line.rstrip()[:-1] + ' ' + lines[n].strip()
                n += 1
                m = re.match(r'^ExecStart=[-@:+!]*(.*)$', line)
                if not m or not m.group(1).strip():
                    continue
                words = shlex.split(m.group(1))
                words = [w.replace('${STATE_DIRECTORY}', '/var/lib/' + state[0]) if state else w
                         for w in words]
                cmd = Command(f'{rel}:{start}', words, 'systemd', tmp, f'systemd-{fn}')
                for srcs, dest in installs:
                    for s in srcs:
                        if s.startswith('build/'):
                            if dest.endswith('/'):
                                cmd.binaries[dest + os.path.basename(s)] = os.path.join(build_dir, s[6:])
                        elif s.startswith('deploy/systemd/'):
                            continue
                        else:
                            target = dest + os.path.basename(s) if dest.endswith('/') else dest
                            cmd.put(target, src=os.path.join(src, s))
                            cmd.subs.append(f'{target}: {s} (the unit\'s install line)')
                for s in state:
                    os.makedirs(cmd.path('/var/lib/' + s), exist_ok=True)
                    cmd.subs.append(f'StateDirectory /var/lib/{s}: empty directory')
                cmds.append(cmd)
    return cmds


# --------------------------------------------------------------------------
# Running and probing

def docker_commands(dockerfiles, build_dir, tmp):
    cmds = []
    for df in dockerfiles:
        for what in ('entrypoint', 'cmd'):
            v = getattr(df, what)
            if v is None:
                continue
            line, argv = v
            if what == 'cmd' and df.entrypoint is not None:
                argv = df.entrypoint[1] + argv
            cmd = Command(f'deploy/{df.rel}:{line}', argv, 'docker', tmp, f'docker-{df.rel}-{what}')
            cmd.binaries = df.binaries(build_dir)
            for _, run in df.stages[-1]['run']:
                for m in re.finditer(r'mkdir -p ((?:/\S+\s*)+)', run):
                    for p in m.group(1).split():
                        os.makedirs(cmd.path(p), exist_ok=True)
            cmds.append(cmd)
    return cmds


def health(addr, tls, deadline):
    """'SERVING' or what went wrong, asking until deadline."""
    import grpc
    last = 'no answer'
    while time.time() < deadline:
        try:
            if tls:
                creds = grpc.ssl_channel_credentials(root_certificates=open(CA[0], 'rb').read())
                ch = grpc.secure_channel(addr, creds)
            else:
                ch = grpc.insecure_channel(addr)
            with ch:
                check = ch.unary_unary('/grpc.health.v1.Health/Check')
                resp = check(b'', timeout=2)
            status = {b'\x08\x01': 'SERVING', b'\x08\x02': 'NOT_SERVING'}.get(resp, repr(resp))
            if status == 'SERVING':
                return status
            last = status
        except Exception as e:   # grpc.RpcError and connection errors
            last = (e.details() if hasattr(e, 'details') else '') or str(e)
        time.sleep(0.2)
    return last


def start(cmd):
    argv = cmd.final_argv()
    cmd.final = argv
    if cmd.skip:
        return
    env = dict(os.environ)
    env.update(cmd.env)
    if cmd.read_only_root and not cmd.tmp_mounted and 'TMPDIR' not in cmd.env:
        # Not writable even for root: a path under a regular file.
        blocker = os.path.join(os.path.dirname(cmd.root), 'read-only-root')
        open(blocker, 'w').close()
        env['TMPDIR'] = os.path.join(blocker, 'tmp')
        cmd.subs.append('readOnlyRootFilesystem: TMPDIR not writable (no volume at /tmp)')
    elif cmd.tmp_mounted:
        env['TMPDIR'] = cmd.path('/tmp')
    else:
        tmpdir = os.path.join(os.path.dirname(cmd.root), 'tmp')
        os.makedirs(tmpdir, exist_ok=True)
        env['TMPDIR'] = tmpdir
    cmd.proc = subprocess.Popen(argv, stdout=open(cmd.log, 'w'), stderr=subprocess.STDOUT,
                                env=env, cwd=cmd.root, start_new_session=True)
    cmd.started = time.time()


def tail(path, n=8):
    try:
        return '\n      '.join(read(path).strip().split('\n')[-n:])
    except OSError:
        return ''


def main():
    global CA
    ap = argparse.ArgumentParser()
    ap.add_argument('--source-dir', required=True)
    ap.add_argument('--build-dir', required=True)
    a = ap.parse_args()
    src, build = os.path.abspath(a.source_dir), os.path.abspath(a.build_dir)
    t0 = time.time()
    if importlib.util.find_spec('grpc') is None:
        print('SKIP: python3-grpcio is not installed (grpc.health.v1 probe)')
        return 0
    tmp = tempfile.mkdtemp(prefix='deploy-commands-')
    cmds = []
    try:
        CA = make_tls(tmp)
        dockerfiles = [Dockerfile(os.path.join(src, 'deploy', f), f)
                       for f in sorted(os.listdir(os.path.join(src, 'deploy')))
                       if re.fullmatch(r'Dockerfile(\.\w+)?', f) and f != 'Dockerfile.dockerignore']
        check_dockerfile_roles(dockerfiles, build)
        check_runtime_libraries(dockerfiles, build)
        cmds = (docker_commands(dockerfiles, build, tmp) +
                kubernetes_commands(src, build, dockerfiles, tmp) +
                systemd_commands(src, build, tmp))
        for cmd in cmds:
            start(cmd)
        for cmd in cmds:
            print(f'{cmd.where}: {cmd.shown()}')
            for s in cmd.subs:
                print(f'    {s}')
            if cmd.ports:
                print('    ' + ', '.join(f'{k} -> 127.0.0.1:{v}' for k, v in cmd.ports.items()))
            if cmd.skip:
                if 'openssl' in cmd.skip:
                    print(f'    SKIPPED: {cmd.skip}')
                else:
                    fail(cmd.where, cmd.shown(), cmd.skip)
                continue
            print('    ran: ' + ' '.join(shlex.quote(x) for x in cmd.final))
            listen = Command.setting(cmd.final, 'listen', 'listen')
            health_listen = Command.setting(cmd.final, 'health-listen', 'health_listen')
            tls = Command.setting(cmd.final, 'tls-cert', 'tls_cert') is not None
            targets = [(listen, tls)] + ([(health_listen, False)] if health_listen else [])
            if not listen:
                fail(cmd.where, cmd.shown(), 'no listen address (flag or settings file)')
                continue
            for addr, secure in targets:
                deadline = cmd.started + HEALTH_TIMEOUT_S
                got = 'exited'
                while time.time() < deadline and cmd.proc.poll() is None:
                    got = health(addr, secure, min(deadline, time.time() + 1))
                    if got == 'SERVING':
                        break
                if got != 'SERVING':
                    rc = cmd.proc.poll()
                    why = (f'exited {rc} before serving health' if rc is not None else
                           f'health on {addr} not SERVING after {HEALTH_TIMEOUT_S:.0f} s: {got}')
                    fail(cmd.where, cmd.shown(), why + '\n    log: ' + tail(cmd.log))
                    break
                cmd.served = True
                print(f'    health {addr} ({"TLS" if secure else "plaintext"}): SERVING after '
                      f'{time.time() - cmd.started:.1f} s')
        for cmd in cmds:
            if cmd.proc is None:
                continue
            if cmd.proc.poll() is None:
                cmd.proc.send_signal(signal.SIGTERM)
                cmd.stopping = time.time()
            elif cmd.served:
                fail(cmd.where, cmd.shown(), f'exited {cmd.proc.returncode} by itself after '
                     'serving health\n    log: ' + tail(cmd.log))
        for cmd in cmds:
            if cmd.stopping is None:
                continue
            try:
                rc = cmd.proc.wait(timeout=max(0.1, cmd.stopping + STOP_TIMEOUT_S - time.time()))
            except subprocess.TimeoutExpired:
                fail(cmd.where, cmd.shown(), f'did not exit within {STOP_TIMEOUT_S:.0f} s of SIGTERM')
                continue
            if rc != 0:
                fail(cmd.where, cmd.shown(), f'SIGTERM: exit code {rc}, expected 0'
                     '\n    log: ' + tail(cmd.log))
            else:
                print(f'{cmd.where}: stopped by SIGTERM, exit 0 within '
                      f'{time.time() - cmd.stopping:.1f} s')
    finally:
        # Whatever is left (and the engines an agent started, in its
        # process group) goes.
        for cmd in cmds:
            if cmd.proc is not None:
                try:
                    os.killpg(cmd.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                cmd.proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    for n in notes:
        print('note: ' + n)
    print(f'{len(cmds)} command lines, {len(failures)} failures, {time.time() - t0:.1f} s')
    for f in failures:
        print('FAIL ' + f)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
