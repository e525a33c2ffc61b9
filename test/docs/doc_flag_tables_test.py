#!/usr/bin/python3
"""The flag tables in docs/ agree with the binaries (issue 37, item 6).

Each binary's `--help` is generated from its settings: the defaults it shows
are those of the settings structs the binary runs with (server_config.cc,
agent_config.cc, controller_config.cc, the profiler's flags), so reading
`--help` reads the code. For every flag table of a binary in docs/ this test
checks:

  - coverage: every flag `--help` lists is in the binary's doc tables, and
    every flag the tables name exists;
  - defaults: where a table has a `default` column, the default it states
    is the one `--help` shows (numbers compared as numbers, `required` and
    `none` as such, words by their first two);
  - ranges: where a table states a numeric range for a flag (`1..64`,
    `>= 0`), the binary refuses the first value outside it with exit code 2,
    an error naming the flag, and the same range in its words.

usage: doc_flag_tables_test.py --source-dir DIR --build-dir DIR
Exit 0: all passed; 1: a failure (each names the doc, its line and the
flag).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

# (binary in the build directory, the docs whose tables list its flags; for
# docs/architecture.md only the rows under the heading row naming the
# binary's section count).
BINARIES = {
    'arachne-planner': {
        'path': 'planner_service/server/arachne-planner',
        'docs': ['docs/api.md'],
        'section': '**Planner**',
        # Valid settings besides the flag under test, so that a refusal is
        # the flag's own.
        'base_args': [],
    },
    'arachne-agent': {
        'path': 'worker_agent/arachne-agent',
        'docs': ['docs/agent.md'],
        'section': '**Agent**',
        'base_args': ['--node', 'a', '--gpu-type', 'A6000', '--virtual-gpus',
                      '1'],
    },
    'arachne-controller': {
        'path': 'controller/arachne-controller',
        'docs': ['docs/controller.md'],
        'section': '**Controller**',
        'base_args': None,  # filled in main(): a job file and a state dir
    },
    'arachne-profile': {
        'path': 'planner_service/cli/arachne-profile',
        'docs': ['docs/profiler.md'],
        'section': None,
        'base_args': ['--model', 'tiny-gpt', '--gpu', 'A6000', '--device',
                      'cpu', '--out', '/nonexistent-dir/p.csv'],
    },
}

OPTION = re.compile(
    r'^  (?:-h,)?--(?P<flag>[a-z0-9][a-z0-9-]*)'
    r'(?: (?P<type>[A-Z]+)(?:=(?P<default>\S+))?(?: \.\.\.)?(?: REQUIRED)?)?'
    r'(?P<rest>.*)$')
HELP_DEFAULT = re.compile(r'\(default:? ([^)]*)\)|[;,] default:? ([^;)]*)')
# `REQUIRED` (CLI11's mark) or "(required)" / "(...; required)" in the
# description; "(required without CUDA GPUs; ...)" is not required always.
REQUIRED = re.compile(r' REQUIRED\b|[(;] ?required\)')
FLAG_IN_CELL = re.compile(r'`--([a-z0-9][a-z0-9-]*)')
# `1..64` (both ends in), `(>= 0)`, and `(0, 1]` (the low end out).
RANGE_IN_TEXT = re.compile(r'\b(-?\d+(?:\.\d+)?)\.\.(-?\d+(?:\.\d+)?)\b|'
                           r'\(>= (-?\d+(?:\.\d+)?)\)|'
                           r'\((-?\d+(?:\.\d+)?), (-?\d+(?:\.\d+)?)\]')


class Flag:
    def __init__(self, name, type_, default, text):
        self.name = name
        self.type = type_          # TEXT, INT, FLOAT or None (a switch)
        self.default = default     # what --help shows, or None
        self.text = text
        self.required = bool(REQUIRED.search(text))


def parse_help(binary):
    """Flag name -> Flag, from `binary --help`."""
    out = subprocess.run([binary, '--help'], capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f'{binary} --help exited {out.returncode}: '
                           f'{out.stderr.strip()}')
    flags = {}
    last = None
    for line in out.stdout.splitlines():
        m = OPTION.match(line)
        if m:
            name = m.group('flag')
            if name == 'help':
                last = None
                continue
            last = Flag(name, m.group('type'), m.group('default'), line)
            flags[name] = last
        elif last is not None and line.startswith('    '):
            last.text += ' ' + line.strip()  # a description on its own line
            last.required = last.required or bool(REQUIRED.search(line))
    for f in flags.values():
        if f.default is None:
            m = HELP_DEFAULT.search(f.text)
            if m:
                f.default = (m.group(1) or m.group(2)).strip()
    return flags


def markdown_rows(path):
    """(line number, header cells, row cells, the section row above) of
    every table row of `path`."""
    rows = []
    header = None
    section = None
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    for i, line in enumerate(lines, 1):
        if not line.startswith('|'):
            header = None
            section = None
            continue
        # Cells split on '|' not escaped as '\|'.
        cells = [c.strip() for c in re.split(r'(?<!\\)\|', line)[1:-1]]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if all(re.fullmatch(r':?-+:?', c) for c in cells):
            continue
        if cells[0].startswith('**'):
            section = cells[0].split()[0]
            continue
        rows.append((i, header, cells, section))
    return rows


def words(text):
    text = text.replace('`', '').replace(' + ', ' and ').lower()
    return [w.strip(',;:.()') for w in text.split() if w.strip(',;:.()')]


def number(text):
    m = re.match(r'^-?\d+(?:\.\d+)?', text.replace('`', '').strip())
    return float(m.group(0)) if m else None


def default_mismatch(flag, doc_default):
    """Why the doc's default cell disagrees with --help, or None."""
    doc = doc_default.replace('`', '').strip()
    doc_l = doc.lower()
    if doc_l == 'required':
        return None if flag.required else 'the doc says required; --help does not'
    if flag.required:
        return f'--help says required; the doc says "{doc}"'
    if doc_l.startswith(('none', '—')):
        if flag.default is None or flag.default.lower().startswith('none'):
            return None
        return f'the doc says none; --help shows default "{flag.default}"'
    if flag.type is None:  # a switch: off unless given
        return None if doc_l == 'false' else (
            f'a switch is off by default; the doc says "{doc}"')
    if flag.default is None:
        return f'--help shows no default; the doc says "{doc}"'
    d, h = number(doc), number(flag.default)
    if d is not None or h is not None:
        if d is None or h is None or abs(d - h) > 1e-12 * max(1, abs(h)):
            return f'the doc says "{doc}"; --help shows "{flag.default}"'
        return None
    if words(doc)[:2] != words(flag.default)[:2]:
        return f'the doc says "{doc}"; --help shows "{flag.default}"'
    return None


def doc_rows_for(source_dir, spec):
    """(doc, line, flags named, default cell or None, meaning) of the
    binary's rows."""
    out = []
    docs = [(d, None) for d in spec['docs']]
    if spec['section']:
        docs.append(('docs/architecture.md', spec['section']))
    for doc, section in docs:
        for line, header, cells, row_section in markdown_rows(
                os.path.join(source_dir, doc)):
            if not header or header[0] not in ('flag', 'level'):
                continue
            if section is not None and row_section != section:
                continue
            if header[0] == 'level' and not cells[0].startswith('`--'):
                continue
            names = FLAG_IN_CELL.findall(cells[0])
            if not names:
                continue
            default = (cells[header.index('default')]
                       if 'default' in header else None)
            meaning = cells[-1]
            out.append((doc, line, names, default, meaning))
    return out


def check_binary(name, spec, source_dir, build_dir, failures):
    binary = os.path.join(build_dir, spec['path'])
    if not os.path.exists(binary):
        print(f'SKIP {name}: {binary} is not built')
        return 0
    flags = parse_help(binary)
    rows = doc_rows_for(source_dir, spec)
    checked = 0
    documented = set()
    main_docs = set(spec['docs'])
    for doc, line, names, default, meaning in rows:
        where = f'{doc}:{line}'
        parts = [default] * len(names)
        if default is not None and len(names) > 1 and ' / ' in default:
            parts = [p.strip() for p in default.split(' / ')]
            if len(parts) != len(names):
                failures.append(f'{where}: {len(names)} flags but '
                                f'{len(parts)} defaults "{default}"')
                continue
        for flag_name, part in zip(names, parts):
            if doc in main_docs:
                documented.add(flag_name)
            flag = flags.get(flag_name)
            if flag is None:
                failures.append(f'{where}: --{flag_name} is not a flag of '
                                f'{name} (--help)')
                continue
            if part is not None:
                checked += 1
                why = default_mismatch(flag, part)
                if why:
                    failures.append(f'{where}: {name} --{flag_name}: {why}')
            if flag.type in ('INT', 'FLOAT') and len(names) == 1:
                checked += check_range(name, binary, spec, flag, where,
                                       meaning, failures)
    for flag_name in sorted(set(flags) - documented):
        failures.append(f'{", ".join(spec["docs"])}: {name} --{flag_name} '
                        f'is not in the flag table (--help lists it)')
    return checked


def check_range(name, binary, spec, flag, where, meaning, failures):
    """The binary refuses the first value past the range the doc states."""
    m = RANGE_IN_TEXT.search(meaning.replace('`', ''))
    if not m:
        return 0
    step = 1 if flag.type == 'INT' else 0.5
    if m.group(3) is not None:
        stated = f'>= {m.group(3)}'
        outside = [float(m.group(3)) - step]
    elif m.group(4) is not None:
        stated = f'({m.group(4)}, {m.group(5)}]'
        outside = [float(m.group(4)), float(m.group(5)) + step]
    else:
        stated = f'{m.group(1)}..{m.group(2)}'
        outside = [float(m.group(1)) - step, float(m.group(2)) + step]
    for value in outside:
        text = str(int(value)) if flag.type == 'INT' else str(value)
        args = [a for a in spec['base_args']]
        if f'--{flag.name}' in args:
            i = args.index(f'--{flag.name}')
            del args[i:i + 2]
        out = subprocess.run([binary] + args + [f'--{flag.name}', text],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 2 or f'{flag.name}' not in out.stderr.replace(
                '_', '-') or stated not in out.stderr:
            failures.append(
                f'{where}: {name} --{flag.name} {text}: the doc states '
                f'{stated}; expected exit 2 naming --{flag.name} and '
                f'"{stated}", got exit {out.returncode}: '
                f'{out.stderr.strip()[-300:]}')
    return 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--source-dir', required=True)
    parser.add_argument('--build-dir', required=True)
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, 'job.yaml')
        with open(job, 'w') as f:
            f.write('model: {name: tiny-gpt}\ntraining: {seq_len: 32, '
                    'global_batch: 8}\n')
        BINARIES['arachne-controller']['base_args'] = [
            '--job', job, '--state-dir', os.path.join(tmp, 'state')]
        total = 0
        for name, spec in BINARIES.items():
            n = check_binary(name, spec, args.source_dir, args.build_dir,
                             failures)
            print(f'{name}: {n} defaults and ranges checked')
            total += n
    for f in failures:
        print('FAIL', f)
    if not failures and total == 0:
        print('FAIL no binary was built: nothing was checked')
        return 1
    print(f'{total} checks, {len(failures)} failures')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
