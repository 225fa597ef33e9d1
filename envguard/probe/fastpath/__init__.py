"""The snapshot's fast path: everything that only makes a snapshot faster.

What a snapshot reports never depends on this package: the tests compare snapshots taken
through the memo files and stat-ahead with snapshots taken without them
(``use_memo=False``), and a memo file deleted only costs time. The modules import nothing
of the collector, the scan or the checks they speed up (``tests/test_architecture.py``),
and this file imports none of them: a command imports what it uses.

- :mod:`~envguard.probe.fastpath.marshal_file`: the ``marshal`` memo file (tag, bounded
  read, atomic write) and stat keys;
- :mod:`~envguard.probe.fastpath.hashes`: file digests for ``--verify hash``;
- :mod:`~envguard.probe.fastpath.records`: parsed RECORD files and dist-info folders, their
  rows kept as :mod:`~envguard.probe.fastpath.rows` (checksummed chunks);
- :mod:`~envguard.probe.fastpath.facts`: the interpreter probe's answer;
- :mod:`~envguard.probe.fastpath.gpu`: ``nvidia-smi``'s answer;
- :mod:`~envguard.probe.fastpath.statahead`: the RECORD check's ``stat`` work, shared with
  forked workers and started on the records memo's rows before the collector is imported;
- :mod:`~envguard.probe.fastpath.prune`: memo files unused for a month removed.

What a memo may be trusted with. A memo's answer is used only while what it was computed
from is unchanged, and that is checked on every use, never assumed:

- a file's stat key is (size, mtime_ns, ctime_ns, inode) (``marshal_file.stat_key``). The
  inode change time cannot be set from user space, so a file edited and then given back
  its size and modification time still counts as changed;
- a digest (``hashes``) is used while the file's stat key is the one it was hashed with,
  under the same algorithm;
- a RECORD's parse (``records``) while RECORD's stat key is the same; a dist-info folder's
  read while each of METADATA, RECORD, WHEEL, INSTALLER, ``direct_url.json`` and
  REQUESTED keeps its stat key (an absent file is part of the key). A folder entry is
  written only if the key was the same before and after the read, and only if nothing in
  it is what the redactor masks (a memo file holds no credential);
- the interpreter's facts (``facts``) while the interpreter (its path, the link and the
  binary behind it), ``pyvenv.cfg``, the ``PYTHON*`` and other variables the probe reads
  (kept as a digest), the user, the working directory and every ``sys.path`` folder with
  its ``.pth`` files and site modules keep their keys. An answer is not kept if any of
  these changed while the probe ran or in the two seconds before it started, nor if it
  holds anything credential-like. What the key cannot see: an edit inside a module that a
  ``.pth`` file imports;
- ``nvidia-smi``'s answer (``gpu``) while ``/proc/driver/nvidia`` (the driver's version,
  each GPU's model, UUID and bus location) is unchanged: the file is named by its digest.
  Only an answer that names the GPUs (or says there are none) is kept; without
  ``/proc/driver/nvidia`` nothing is kept and ``nvidia-smi`` runs every time;
- stat-ahead's answers only for a distribution that the scan read from the same records
  memo (``InstalledDist.from_memo``), with the RECORD time the work was started with
  (:meth:`~envguard.probe.fastpath.statahead.Ahead.units_for`): its rows are then the
  ones the workers checked. Any other distribution is checked by this process.

Every value read back is checked for its exact type where it is used (``type(x) is
tuple``, ``str``, ...) and a value of another shape is a miss, so a damaged or forged memo
file costs time, never a wrong snapshot. ``marshal`` runs no code, and refuses code
objects where Python can (3.13+); a chunk of RECORD rows carries a CRC-32 and is parsed
from RECORD again when it does not match.

What invalidates a memo: a changed key (that entry only); a file whose tag is not the one
this code writes (the whole file: a format change, another ``marshal`` version, or for the
records memo a distribution of other fields); a file that is not a regular file, is
larger than ``marshal_file.MEMO_BYTES`` (64 MiB; 1 MiB for the GPU memo) or does not
parse; a folder that is not private (below). The records memo also drops, when it is
saved, every entry the snapshot did not use (a distribution no longer installed).

Names, versions and pruning. The files lie in :func:`envguard.paths.memo_dir`:
``records-<P>.marshal`` and ``hashes-<P>.marshal`` per environment (``P``: the first 16
hex digits of the SHA-256 of the prefix's real path), ``interpreter-<E>.marshal`` per
interpreter path (``E``: likewise), ``gpu-<G>.json`` per driver state, and
``closure-<C>.json`` (24 hex digits; :mod:`envguard.gate.closure`'s dependency closures).
A ``marshal`` file is ``((*TAG, marshal.version), entries)``; the records memo's tag also
holds the digest of the fields a folder entry lays out (``records.fields_digest``), and is
checked on the scan's first lookup rather than on load, because stat-ahead loads the
file before :mod:`envguard.model` is imported. The JSON memos carry no tag: their readers
check each value's type. Where any memo file is written, at most once a day per folder
(the stamp file ``.prune-stamp``), this user's regular files named as above and unused for
30 days (the later of their modification and access times) are removed, nothing followed
(:mod:`~envguard.probe.fastpath.prune`). A new kind of memo file needs its name in
``prune.MEMO_NAME``, or it is never pruned. Within a hash memo, a save drops the entries
of files that no longer exist and that this run did not use.

Adding a field to a memoised record. A field of :class:`~envguard.model.Distribution` (or
of a record class it holds, such as :class:`~envguard.model.DirectUrl`) needs no edit
here: a folder entry holds the fields in ``dataclasses.fields`` order
(:class:`~envguard.probe.fastpath.records.Codec`; ``location``, ``metadata_dir`` and
``shadowed`` are not stored), and the changed field list changes the tag, so files
written before are ignored. Its type must be one the codec knows (``str``, ``int``,
``bool``, ``float``, ``list[str]``, a record class of the model, each ``| None``);
``tests/envguard/probe/fastpath/test_record_rows.py`` round-trips every field and fails
for another. Any other change to what an entry holds (the hash memo's, the interpreter facts',
:meth:`~envguard.probe.fastpath.rows.RecordRows.packed`, a RECORD entry's) bumps the
number in that module's ``TAG``; a JSON memo's reader checks the new value's type.

Fork before threads. Stat-ahead forks worker processes, and a fork copies only the
calling thread: a lock another thread held stays held in the child (Python 3.12 warns).
:func:`~envguard.probe.background.fork_is_safe` allows it only on Linux with no other
thread alive, so the order is: a command that knows its environment starts the
interpreter probe (a child process, no thread) and then stat-ahead
(:func:`envguard.probe.prefetch`), before it imports the collector; the collector begins
the RECORD check, which may fork, before it starts the threads of its external commands
and ``--deep``. A thread alive anyway only means no fork: this process does the work
alone. Workers leave with
``os._exit`` (no ``atexit`` handler, no flush of the parent's buffers), answer in plain
data through a pipe, and a unit a failed worker took is checked again here. Nothing on
the way to the fork imports :mod:`envguard.model`
(``tests/envguard/probe/fastpath/test_statahead.py``).

The private-folder rule. A memo folder is read and written only when
:func:`envguard.paths.private_folder` trusts it, as ssh trusts ``~/.ssh``: it is owned by
this user and not writable by group or others (made 0700 when missing), and its parent is
owned by this user or root and not writable by group or others unless sticky. Otherwise
there is no memo at all (``paths.DISTRUSTED`` says why; ``ENVGUARD_DEBUG`` shows it): a
memo others could write would steer what a snapshot reports. Memo files are written
atomically, never through a link (:mod:`envguard.atomic`'s ``state_root``), the
``marshal`` ones with mode 0600 and without an fsync (a memo lost in a crash only costs
time).
"""
