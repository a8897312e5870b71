"""The program model: a model and all its uses convert together, or not at all.

Every file given to one run is part of one program. Converting a use of a
model (`no_sync`, clipping, state-dict code) to FSDP2 while the model's
constructor stays FSDP1 gives a program that crashes or trains silently
wrong, so the rewrite runs in two steps:

1. Each file is rewritten as if every constructor converted, and records
   *facts*: its FSDP1 constructors (does each convert on its own? does its
   model leave the file's sight: escapes.py), every use a rule would
   convert and every use a rule leaves FSDP1 (`staying`), each with the
   constructors of the file whose model reaches it (`ties`) and whether a
   model built out of sight may reach it (`untied`).
2. `decide` joins the facts of all files: constructors that share a use
   stand or fall together; a constructor tied to a use that stays, stays;
   while FSDP1 code for untraced models stays, so does every constructor
   whose model escapes. A use converts only if every constructor tied to
   it converts, and a use that cannot be tied to any converts only if no
   model that stays FSDP1 may reach it: none leaves the program's sight, and
   none is used in the use's file (built there, or handed to it). Files
   whose first rewrite assumed too much are rewritten again from the same
   parsed tree with the verdict (`Gate`), so no file is parsed twice.
"""

import posixpath
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import libcst as cst

from migrate_fsdp.rewrite.analysis.escapes import Reach, escapes, factory
from migrate_fsdp.rewrite.analysis.factory_callers import factory_callers
from migrate_fsdp.rewrite.analysis.guards import checked_instance
from migrate_fsdp.rewrite.analysis.kept_parameters import handed, kept_by_callers, kept_message
from migrate_fsdp.rewrite.analysis.models import FSDP_CLASS, fsdp_models, is_main_guard, method_owner
from migrate_fsdp.rewrite.analysis.parameter_tags import tags_parameters
from migrate_fsdp.rewrite.analysis.reachability import declarations, unnamed
from migrate_fsdp.rewrite.analysis.reexports import coresident, import_graph, imported_elsewhere, imported_modules, importing
from migrate_fsdp.rewrite.analysis.remote_calls import RemoteCalls
from migrate_fsdp.rewrite.analysis.value_flow import ValueFlow
from migrate_fsdp.rewrite.names import canonical, is_fsdp1
from migrate_fsdp.rewrite.syntax import dotted, import_aliases, walk

BLOCKED = "MF003"  # a use of a model whose constructor stays FSDP1
KEPT_FSDP1 = "MF004"  # a use of a model from out of sight, in a program that keeps FSDP1 models
DUAL_VERSION = "MF005"  # code that already serves FSDP1 and FSDP2
TIE = "tie"  # not a rule's code: a statement where models of several constructors meet (Gate.meet)

Position = tuple[int, int]  # line, column (1-based) of an original node

# A model's methods whose FSDP1 default a helper gives for any module (Gate.state_read). A file the program reads
# them in but did not parse (it names no FSDP) gets a verdict all the same: it is parsed and the program decided
# again (api.rewrite_program), so that its calls a helper cannot make hold the model back.
STATE_METHODS = ("state_dict", "load_state_dict")


@dataclass(frozen=True)
class Use:
    code: str
    ties: frozenset  # positions of the file's constructors whose model reaches the use
    untied: bool
    function: str = ""  # the innermost function holding the use
    handed_in: bool = True  # its model may be a parameter of that function (else the function finds it itself)
    unsure: bool = False  # shaped like FSDP1's method on a receiver nothing is known of (`model.no_sync()`)
    sites: frozenset = frozenset()  # (path, Position) of every constructor of the program reaching it (decide fills it)
    lasting: bool = False  # a state-dict type set on the model for good (`FSDP.set_state_dict_type`)
    fsdp2_default: bool = False  # the type it sets reads as FSDP2's own `state_dict()` does (sharded, in place):
    # code out of sight reading it gets the same form from the FSDP2 model
    governed: bool = False  # in (or is) a `with FSDP.state_dict_type(...)` block: it reads no type set for good
    dispatchable: bool = False  # a helper serves it for any module: it holds nothing back, and converts as a use
    # of its models where they all convert (Verdict.traced)
    any_model: bool = False  # it stays, reading parameters an optimizer holds: any model of its files may reach it


@dataclass
class FileFacts:
    path: str
    constructors: dict = field(default_factory=dict)  # Position -> converts on its own
    places: dict = field(default_factory=dict)  # constructor Position -> the function holding it, for messages
    escaping: set = field(default_factory=set)  # constructors whose model may reach code out of the file's sight
    holders: dict = field(default_factory=dict)  # escaping constructor Position -> the class whose method built it
    # (`self.model = FSDP(...)`): the files that spell the class may hold its objects, and the model with them
    factories: dict = field(default_factory=dict)  # constructor Position -> the module-level function returning its
    # model (its callers are followed: factory_callers.py)
    wraps_unseen: set = field(default_factory=set)  # constructors wrapping a module built out of sight, which may
    # hold models other constructors sharded (`FSDP(net)` of `net = shard_children(...)`)
    module_level: set = field(default_factory=set)  # constructors of module-level models followed in the file: they
    # escape only if another file imports the module (decide)
    callees: dict = field(default_factory=dict)  # constructor Position -> functions of the file it is handed to
    remotes: dict = field(default_factory=dict)  # constructor Position -> calls handing it to other modules (escapes.Remote)
    wraps_handed: dict = field(default_factory=dict)  # constructor Position -> the parameter of its function it wraps,
    # keeping its Parameter objects (use_orig_params=True): a caller may have kept them before (kept_parameters.py)
    fsdp1_reads: dict = field(default_factory=dict)  # constructor Position -> (Position, attribute) of FSDP1 reads here
    state_reads: set = field(default_factory=set)  # Positions of `m.state_dict()` / `m.load_state_dict(sd)` on a
    # receiver of unknown origin that a helper can serve for any module (Gate.state_read)
    declared: Counter | None = None  # function name -> occurrences that are not uses (reachability.py); None: not parsed
    uses: dict = field(default_factory=dict)  # (Position, code) -> Use
    staying: dict = field(default_factory=dict)  # (Position, code) -> Use a rule could not convert: it stays FSDP1
    settings: dict = field(default_factory=dict)  # FSDP1 setting built apart from its constructors: Position -> the
    # keywords whose values it takes in their FSDP1 or FSDP2 form (an `_or_policy`'s `policies`)
    reads: dict = field(default_factory=dict)  # constructor Position -> keywords read by helpers taking FSDP2 forms too
    custom_policies: dict = field(default_factory=dict)  # Position of a `CustomPolicy(f)` setting -> whether it has
    # an FSDP2 form (f returns no FSDP1 arguments)
    script: bool = False  # it runs as a script (`if __name__ == "__main__":`)
    dispatched: bool = False  # a call on a receiver of unknown origin took a helper serving any module (Gate.dispatch)
    imports_fsdp1: bool = False  # names torch's FSDP1 (not fairscale's, not FSDP2)
    asked_about_fsdp1: bool = False  # a rule asked whether the program builds FSDP1 models at all
    part_of_world: bool = False  # a constructor here may shard its model over some ranks only
    flat_names: bool = False  # a constructor here that converts named flat parameters (use_orig_params not True)
    asked_about_names: bool = False  # a rule asked whether any converting model of the program did
    asked_about_tags: bool = False  # a rule asked whether any file of the program sets attributes on parameters
    asked_about_world: bool = False  # a rule asked whether any model of the program may be sharded over some ranks
    dropped_imports: set = field(default_factory=set)  # module-level names whose FSDP imports the rewrite dropped


@dataclass(frozen=True)
class Denial:
    code: str | None  # None: not a use of FSDP1 at all (an FSDP2 module), nothing to report
    message: str


@dataclass
class Verdict:
    """What one file may convert, decided over the whole program."""

    blocked: dict = field(default_factory=dict)  # constructor Position -> why it stays FSDP1
    denied: dict = field(default_factory=dict)  # (Position, code) -> Denial
    settings: set = field(default_factory=set)  # Positions of FSDP1 settings' definitions that take their FSDP2 form
    checkpointing: set = field(default_factory=set)  # Positions of wrap policies only activation checkpointing reads:
    # FSDP1's form is what it takes, no FSDP1 use to report
    fsdp1_receivers: set = field(default_factory=set)  # Positions of FSDP1-shaped calls on unknown receivers that
    # are FSDP1 models' (nothing else in the program has those methods)
    state_reads: set = field(default_factory=set)  # Positions of FileFacts.state_reads a converting model reaches
    unreached: bool = False  # no FSDP1 model that converts may reach this file (Gate.dispatch)
    builds_fsdp1: bool = False  # another file of the program uses torch's FSDP1
    assumed: bool = False  # the first rewrite assumed the program builds FSDP1 models; it builds none
    part_of_world: bool = False  # a model of the program may be sharded over some ranks only (Gate.part_of_world)
    original_names: bool = False  # no converting model of the program named flat parameters (Gate.flat_names)
    tags_parameters: bool = False  # a file of the program sets attributes on parameters (Gate.tags_parameters)
    kept_imports: frozenset = frozenset()  # names another file imports from this one: their imports stay
    parse_late: bool = False  # not parsed (it names no FSDP), but a model out of sight may have its state read there
    traced: set = field(default_factory=set)  # Positions of dispatchable uses whose models all convert, traced there

    def __bool__(self) -> bool:
        return bool(
            self.parse_late
            or self.traced
            or self.blocked
            or self.denied
            or self.settings
            or self.checkpointing
            or self.fsdp1_receivers
            or self.state_reads
            or self.unreached
            or self.builds_fsdp1
            or self.assumed
            or self.part_of_world
            or self.original_names
            or self.tags_parameters
            or self.kept_imports
        )


def decide(facts: list[FileFacts], sources: Mapping[str, bytes] | None = None) -> dict[str, Verdict]:
    """The verdict for every file whose first rewrite must be redone (others are final).

    `sources`: the bytes of every file of the program (also those not parsed), to find functions it never names.
    """
    parent: dict = {}

    places = {(f.path, p): f.places.get(p, "") for f in facts for p in f.constructors}

    def where(site) -> str:
        # No line number: TODO lines the rewrite adds above a constructor would change it on every run.
        return f"{site[0]}" + (f" ({places[site]})" if places.get(site) else "")

    def find(site):
        while parent.setdefault(site, site) != site:
            site = parent[site]
        return site

    remote_calls = RemoteCalls(sources or {})
    graph: dict[str, set[str]] = {}

    def imports() -> dict[str, set[str]]:
        """What each file of the program imports, found once, when first needed."""
        if not graph and sources:
            graph.update(import_graph(sources, remote_calls))
        return graph
    reexported = imported_elsewhere({f.path: f.dropped_imports for f in facts if f.dropped_imports}, sources or {}, remote_calls)
    if sources is None:  # what imports what is unknown: any module-level model may be imported
        imported = {f.path for f in facts}
    else:
        imported = imported_modules(imports()) if any(f.module_level or f.factories for f in facts) else None
    for file in facts:
        if imported is not None and file.path in imported:
            file.escaping |= file.module_level
    unseen_reads, reaches, state_reads, entered = _tie_handed_on(facts, remote_calls, sources, imported or set())
    # A factory whose callers the program cannot all follow (held in a table: torchtitan's
    # `models_parallelize_fns["llama"](model, ...)`) hands its model to the entry points importing it.
    lost_factories = {f.path for f in facts for position in f.factories if position in f.escaping}
    if lost_factories and sources:
        entered |= importing(imports(), lost_factories)
    adopted = _adopt_unsure_receivers(facts, sources or {})
    for file in facts:
        for use in file.uses.values():
            sites = sorted(use.sites)
            for other in sites[1:]:
                parent[find(other)] = find(sites[0])
    converts = {(f.path, p): c for f in facts for p, c in f.constructors.items()}
    by_path = {f.path: f for f in facts}
    refused = _parameters_kept_by_callers(facts, remote_calls, sources or {})
    kept = {site for site, c in converts.items() if not c} | set(refused)
    held = {}  # a constructor that could convert but has a use that stays FSDP1 -> that use's code and file
    flow = ValueFlow(remote_calls)
    for (path, _), (sites, readable) in _custom_policy_readers(facts, flow).items():
        for site in sites[1:]:
            parent[find(site)] = find(sites[0])
        if not readable:
            for site in sites:
                held.setdefault(site, f"a CustomPolicy of {path} returning FSDP1 arguments")
    for file in facts:
        for use in file.staying.values():
            for site in use.sites:
                held.setdefault(site, f"{use.code} in {file.path}")
    for site, path in unseen_reads.items():
        held.setdefault(site, f"{path} stays FSDP1's: no rule there could tell it is this model")
    unfollowed = _settings_read_out_of_sight(facts, state_reads)
    for (path, _), (sites, _) in unfollowed.items():
        for site in sites:
            held.setdefault(site, f"MF202 in {path}")
    unplaced = {u.function for f in facts for u in (*f.uses.values(), *f.staying.values()) if u.untied and not u.sites}
    dead = unnamed(unplaced, {f.path: f.declared for f in facts}, sources) if sources else set()

    def reachable(use) -> bool:
        # A use on a parameter of a function nobody calls meets no model of the program; one whose function
        # finds its model itself (a factory, a global) may run from outside: an entry point run by name.
        return use.untied and (use.sites or use.function not in dead or not use.handed_in)

    untied = sorted((f.path, key) for f in facts for key, use in f.uses.items() if reachable(use) and not use.dispatchable)
    scripts = {f.path for f in facts if f.script}

    def runs_alone(path: str) -> bool:
        """`path` is a script that no file imports (`python train.py`): it runs only in its own processes, while a
        module may be imported by name anywhere (a library reading a config)."""
        nonlocal imported
        if path in by_path:
            script = path in scripts
        else:  # a file not parsed (it names no FSDP)
            script = sources is not None and bool(_MAIN_GUARD.search(sources.get(path, b"")))
        if not script:
            return False
        if imported is None:  # what imports what, found only when it matters
            imported = imported_modules(imports())
        return path not in imported

    def open_to_escapes(path: str) -> bool:
        """A model out of the program's sight runs no function of a script that no file imports, unless it went out
        of sight from there (`self.teacher = make_teacher(...)` in the script)."""
        return path in entered or not runs_alone(path)

    untied_staying = sorted(
        (f.path, f"{use.code} in {f.path}") for f in facts for use in f.staying.values() if reachable(use) and open_to_escapes(f.path)
    )
    alongside_of: dict[str, set[str]] = {}

    def together(one: str, other: str) -> bool:
        """Whether a model leaving sight from file `one` may run code of file `other`: any module of a package, or of
        `one`'s own directory, may be; a script that no file imports, or a module outside any package in another
        directory (importable only with that directory on sys.path: by its own scripts), only in the processes it
        shares with `one` (one imports the other, or a third both)."""
        if not runs_alone(other) and not _elsewhere_outside_packages(other, one, sources):
            return True
        for path in (one, other):
            if path not in alongside_of:
                alongside_of[path] = coresident(imports(), {path})
        return other in alongside_of[one] or one in alongside_of[other]
    # An optimizer holds the parameters of whichever models its file's callers hand it: a use reading them that stays
    # holds back every model of the files it runs with.
    for file in facts:
        for use in file.staying.values():
            if use.any_model and reachable(use):
                for site in sorted(converts):
                    if converts[site] and together(site[0], file.path):
                        held.setdefault(site, f"{use.code} in {file.path}")
    # An FSDP1 model that stays may meet a use on a model of unknown origin anywhere if it leaves the program's
    # sight; one the program follows meets only uses in the files it reaches (its own, those it is handed to).
    escaping = {}  # a constructor that converts but whose model may meet an untied use that stays -> that use

    def staying_models() -> list:
        """The constructors staying FSDP1, root causes first: models that cannot convert, then those a use of
        their own holds back."""
        return sorted(kept | set(held) | set(escaping), key=lambda site: (site not in kept, not isinstance(held.get(site), str), site))

    def reaching(staying: list, path: str, function: str | None = None):
        """The first of `staying` whose model may meet a use of unknown origin in `path` (in `function` there,
        when given: a model handed to `save_b` of a module meets no use in its `save_a`), if any."""
        return next(
            (site for site in staying if _meets(reaches[site], path, function) and (reaches[site] is not None or together(site[0], path))),
            None,
        )

    # A model that stays FSDP1 and leaves sight, or wraps a module built out of sight, may meet a model that leaves
    # sight (a registry of models, blocks a helper sharded): those stay FSDP1 with it.
    unseen_meetings = {(f.path, p) for f in facts for p in f.constructors if p in f.escaping or p in f.wraps_unseen}
    while True:  # models held back by the uses they share hold back more uses in turn
        staying = staying_models()
        denied_untied = [(path, key) for path, key in untied if reaching(staying, path, by_path[path].uses[key].function) is not None]
        open_denied = [(path, key) for path, key in denied_untied if open_to_escapes(path)]
        if not escaping:
            # what a model leaving sight may meet there, in the files that may run with its own
            causes = [
                *untied_staying,
                *((path, (path, key)) for path, key in open_denied),
                *((s[0], f"the FSDP1 model of {where(s)}, met out of sight") for s in staying if s in unseen_meetings),
            ]
            for file in facts:
                for position in file.escaping:
                    site = (file.path, position)
                    if file.constructors.get(position) and site not in held:
                        first = next((why for path, why in causes if together(file.path, path)), None)
                        if first is not None:
                            escaping[site] = first
        more = {
            site: (path, key)
            for path, key in denied_untied
            for site in by_path[path].uses[key].sites
            if converts.get(site) and site not in escaping and site not in held
        }
        if not more:
            break
        held.update(more)
    kept_for_uses = set(held) | set(escaping)
    cause = {}  # component root -> the first constructor in it that cannot convert, else the first held back
    for site in sorted(kept | kept_for_uses, key=lambda site: (site not in kept, site)):
        cause.setdefault(find(site), site)
    denials = {}
    final_staying = staying_models()
    for file in facts:
        for key, use in file.uses.items():
            if key in file.staying or use.dispatchable:  # refused by its rule (its report says why), or served anyway
                continue
            if (file.path, key) in unfollowed:
                denials[(file.path, key)] = Denial(KEPT_FSDP1, unfollowed[(file.path, key)][1])
                continue
            # A constructor that cannot convert first: the cause, rather than one it holds back.
            blockers = sorted((b for b in (cause.get(find(site)) for site in use.sites) if b is not None), key=lambda b: (b not in kept, b))
            threat = reaching(final_staying, file.path, use.function) if use.untied else None
            if threat is not None and not (blockers and blockers[0] in kept):
                blockers = []  # held back only by this use itself: the cause is the model of unknown origin
            if blockers:
                denials[(file.path, key)] = Denial(BLOCKED, f"blocked: the model's FSDP(...) in {where(blockers[0])} stays FSDP1")
            elif threat is not None:
                denials[(file.path, key)] = Denial(
                    KEPT_FSDP1, f"model may be FSDP1: the FSDP(...) in {where(threat)} stays; convert that first"
                )

    def cited(why) -> str:
        """A use holding a model back, as the report prints it: its code (the denial's, if it is denied), its file."""
        if isinstance(why, str):
            return why
        path, key = why
        denial = denials.get(why)
        return f"{denial.code if denial is not None else key[1]} in {path}"

    verdicts: dict[str, Verdict] = {}
    builds_fsdp1 = any(f.imports_fsdp1 or f.constructors for f in facts)
    asked_about_tags = any(f.asked_about_tags for f in facts)  # then every file's text is read, once
    tagged = asked_about_tags and any(tags_parameters(source) for source in (sources or {}).values())
    for file in facts:
        verdict = Verdict(
            builds_fsdp1=builds_fsdp1 and file.asked_about_fsdp1,
            assumed=file.asked_about_fsdp1 and not builds_fsdp1,
            fsdp1_receivers=adopted.get(file.path, set()),
            part_of_world=file.asked_about_world and any(f.part_of_world for f in facts),
            original_names=file.asked_about_names and not any(f.flat_names for f in facts),
            tags_parameters=file.asked_about_tags and tagged,
            kept_imports=reexported.get(file.path, frozenset()),
        )
        for position, converts in file.constructors.items():
            site = (file.path, position)
            blocker = cause.get(find(site))
            if converts and site in refused:
                verdict.blocked[position] = refused[site]
            elif converts and blocker in held:
                verdict.blocked[position] = f"its model has a use that stays FSDP1 ({cited(held[blocker])})"
            elif converts and blocker in escaping:
                verdict.blocked[position] = f"its model may reach FSDP1 code that stays ({cited(escaping[blocker])})"
            elif converts and blocker is not None:
                verdict.blocked[position] = f"stays FSDP1 with the FSDP(...) in {where(blocker)}, which shares its uses"
        verdict.denied = {key: denial for (path, key), denial in denials.items() if path == file.path}
        verdicts[file.path] = verdict
    converting = {(f.path, p) for f in facts for p, c in f.constructors.items() if c and p not in verdicts[f.path].blocked}
    for (path, position), sites in state_reads.items():
        if not _parsed(by_path.get(path)):  # parse it and decide again (STATE_METHODS)
            verdicts.setdefault(path, Verdict()).state_reads.add(position)
        elif sites & converting:
            verdicts[path].state_reads.add(position)
    escaped = {path for path, position in converting if reaches[(path, position)] is None}  # files models leave sight from
    if escaped:
        reached = coresident(imports(), escaped) | {path for path in sources if not runs_alone(path)} if sources else escaped
        _escaped_state_reads(facts, verdicts, sources or {}, reached)  # what a model leaving sight may reach
    for file in facts:
        for (position, _), use in file.uses.items():
            no_threat = not use.untied or reaching(final_staying, file.path, use.function) is None  # no FSDP1 model may reach it
            if use.dispatchable and use.sites and use.sites <= converting and no_threat:
                verdicts.setdefault(file.path, Verdict()).traced.add(position)
    for file in facts:
        # a model that leaves sight reaches the files that may run with its own (together), as for the uses above
        if file.dispatched and not any(
            together(site[0], file.path) if reaches[site] is None else file.path in reaches[site] for site in converting
        ):
            verdicts[file.path].unreached = True
    _convert_settings(facts, verdicts, flow)
    return {path: verdict for path, verdict in verdicts.items() if verdict}


def _parameters_kept_by_callers(facts: list[FileFacts], remote_calls: RemoteCalls, sources: Mapping[str, bytes]) -> dict:
    """Constructors wrapping a module whose parameters a caller kept before handing it in -> why they stay."""
    refused = {}
    for file in facts:
        for position, wrapped in file.wraps_handed.items():
            found = kept_by_callers(remote_calls, sources, file.path, wrapped)
            if found is not None:
                path, function, code = found
                refused[(file.path, position)] = kept_message(code, f" in {path}" + (f" ({function}())" if function else ""))
    return refused


def _elsewhere_outside_packages(path: str, one: str, sources: Mapping[str, bytes] | None) -> bool:
    """`path` is a module outside any package (no `__init__.py` beside it) in another directory than `one`: only
    code run with its directory on sys.path imports it (the directory's scripts: `from grad_norm import ...` in
    each of several programs a repository holds)."""
    directory = posixpath.dirname(path)
    if sources is None or directory == posixpath.dirname(one):
        return False
    return posixpath.join(directory, "__init__.py") not in sources


_MAIN_GUARD = re.compile(rb"""__name__\s*==\s*["']__main__["']""")


def _escaped_state_reads(
    facts: list[FileFacts], verdicts: dict[str, Verdict], sources: Mapping[str, bytes], reached: set[str]
) -> None:
    """A model converting to FSDP2 that leaves the program's sight (`self.model = FSDP(...)`, a dict a factory
    returns) may be any receiver of unknown origin whose state dict is read in `reached`, the files that may run
    with one it leaves sight from (`trainer.model.state_dict()` in the script importing the trainer):
    there FSDP1 gave a full state dict and FSDP2 gives shards, silently. Every such read takes the helper that
    gives FSDP1's default for an FSDP2 module and calls any other module's own method; the files that read a
    state dict but name no FSDP are parsed for it (STATE_METHODS). Examples side by side in one repository share
    no model."""
    for file in facts:
        if _parsed(file) and file.state_reads and file.path in reached:
            verdicts.setdefault(file.path, Verdict()).state_reads |= file.state_reads
    parsed = {file.path for file in facts if _parsed(file)}
    for path in reached - parsed:
        if b"state_dict(" in sources.get(path, b""):
            verdicts.setdefault(path, Verdict()).parse_late = True


# What else gives models `no_sync()` or `clip_grad_norm_(max_norm)`: DDP, and the libraries that wrap models in it
# or have their own.
_OTHER_PROVIDERS = re.compile(rb"DistributedDataParallel|\bDDP\b|deepspeed|fairscale|\baccelerate\b|lightning|megatron|colossalai", re.I)


def _adopt_unsure_receivers(facts: list[FileFacts], sources: Mapping[str, bytes]) -> dict[str, set]:
    """Files whose `model.no_sync()` / `model.clip_grad_norm_(1.0)` on a receiver nothing is known of must be an
    FSDP1 model's: the program builds FSDP1 models and nothing else in it provides those methods. Such a call is
    then an untied use (it converts with the program's models) rather than one that stays."""
    # Adopted uses move to `uses` and keep `unsure`: deciding again (api.decide_with_late_files) adopts them again.
    unsure = [f for f in facts if any(use.unsure for use in (*f.staying.values(), *f.uses.values()))]
    if not unsure or not any(f.imports_fsdp1 or f.constructors for f in facts):
        return {}
    if any(_OTHER_PROVIDERS.search(sources[path]) for path in sources):
        return {}
    adopted: dict[str, set] = {}
    for file in unsure:
        for key, use in list(file.staying.items()):
            if use.unsure:
                del file.staying[key]
                file.uses[key] = use
        for key, use in file.uses.items():
            if use.unsure:
                adopted.setdefault(file.path, set()).add(key[0])
    return adopted


def _custom_policy_readers(facts: list[FileFacts], flow: ValueFlow) -> dict:
    """Each `CustomPolicy(f)` setting -> (the constructors its value reaches, whether it has an FSDP2 form). One
    whose value goes out of sight may reach any constructor reading its policy at run time."""
    readers = {}
    constructors = {(f.path, p) for f in facts for p in f.constructors}
    run_time = sorted((f.path, p) for f in facts for p, keywords in f.reads.items() if "auto_wrap_policy" in keywords)
    for file in facts:
        for position, readable in file.custom_policies.items():
            sinks = flow.sinks(file.path, position)
            sites = run_time if sinks is None else sorted({(s.path, s.call) for s in sinks} & constructors)
            readers[(file.path, position)] = (sites, readable)
    return readers


def _convert_settings(facts: list[FileFacts], verdicts: dict[str, Verdict], flow: ValueFlow) -> None:
    """An FSDP1 setting defined apart from its constructors takes its FSDP2 form where it stands when
    every place its value reaches is a constructor that converts, or a setting that converts, reading it
    through a helper taking that form too (value_flow.py); otherwise it stays the FSDP1 object the helpers
    also read. One reaching nothing converts only in a program that keeps no FSDP1 constructor."""
    by_path = {f.path: f for f in facts}
    keeps_fsdp1 = any(not c or p in verdicts[f.path].blocked for f in facts for p, c in f.constructors.items())

    def constructor_reads(sink) -> bool:
        file = by_path.get(sink.path)
        return (
            file is not None
            and bool(file.constructors.get(sink.call))
            and sink.call not in verdicts[sink.path].blocked
            and sink.keyword in file.reads.get(sink.call, ())
        )

    reached = {(f.path, p): flow.sinks(f.path, p) for f in facts for p in f.settings}
    for (path, position), sinks in reached.items():
        if sinks and all(sink.checkpointing for sink in sinks):
            verdicts[path].checkpointing.add(position)
    converting = {site for site, sinks in reached.items() if sinks is not None and (sinks or not keeps_fsdp1)}
    changed = True
    while changed:  # a setting read by another (an `_or_policy`'s element) converts only if that one does
        changed = False
        for site in sorted(converting):
            for sink in reached[site]:
                setting = (sink.path, sink.call)
                if constructor_reads(sink) or setting in converting and sink.keyword in by_path[sink.path].settings[sink.call]:
                    continue
                converting.discard(site)
                changed = True
                break
    for path, position in converting:
        verdicts[path].settings.add(position)


# Uses that read the state-dict type set on their model: its state dict, its optimizer's.
_READS_STATE_DICT_TYPE = ("MF202", "MF203")


def _settings_read_out_of_sight(facts: list[FileFacts], state_reads: dict) -> dict:
    """`FSDP.set_state_dict_type(model, ...)` uses whose setting a state dict of the model is read under out of its
    function (a helper it is handed to, or code out of the program's sight): (path, key) -> (their sites, why).

    The rewrite gives each call the setting in force where it stands; a helper reading the model's state dict
    elsewhere would get FSDP1's default instead, so the model stays FSDP1 with the setting."""
    escaping = {(f.path, p) for f in facts for p in f.escaping}
    readers = [
        (f.path, u) for f in facts for u in f.uses.values() if u.code in _READS_STATE_DICT_TYPE and not u.lasting and not u.governed
    ]
    found = {}
    for file in facts:
        for key, use in file.uses.items():
            if not use.lasting:
                continue
            away = next(
                (
                    f"{reader.function or 'module level'} ({path})"
                    for path, reader in readers
                    if reader.sites & use.sites and (path, reader.function) != (file.path, use.function)
                ),
                None,
            ) or next((f"{path}:{position[0]}" for (path, position), sites in sorted(state_reads.items()) if sites & use.sites), None)
            if away is not None:
                found[(file.path, key)] = (use.sites, f"the model's state dict is also read in {away}, where this setting would be lost")
            elif use.sites & escaping and not use.fsdp2_default:
                found[(file.path, key)] = (use.sites, "the model reaches code out of the program's sight, where the setting would be lost")
    return found


def _parsed(file: FileFacts | None) -> bool:
    return file is not None and file.declared is not None


def _unseen(file: FileFacts | None, reads, path: str) -> str | None:
    """The first read in `reads` ((position, attribute)) of `file` (at `path`) no rule took for an FSDP1 model's
    (one that converts or stays), for a message; None when a rule took each."""
    known = {key[0] for key in (*file.uses, *file.staying)} | file.state_reads if file is not None else set()
    missed = sorted(read for read in reads if read[0] not in known)
    return f"`.{missed[0][1]}` of it at {path}:{missed[0][0][0]}" if missed else None


ANYWHERE = ""  # a model reaching a file where any of its functions may see it


def _meets(reached: dict | None, path: str, function: str | None) -> bool:
    """Whether a model reaching the files `reached` (path -> functions; None: out of sight) may be seen in
    `function` of `path` (None: anywhere in it)."""
    if reached is None:
        return True
    functions = reached.get(path)
    return functions is not None and (function is None or not function or ANYWHERE in functions or function in functions)


def _tie_handed_on(
    facts: list[FileFacts], remote_calls: RemoteCalls, sources: Mapping[str, bytes] | None, imported: set[str]
) -> tuple[dict, dict]:
    """Every use's `sites`: the constructors of its file whose model reaches it, those handing their model to the
    function holding it, in the same file or from another module, and those whose model a factory function
    returns to it (factory_callers.py). A constructor whose model goes out of sight on the way escapes.

    Returns (unseen, reached, state_reads, entered). unseen: the constructors whose model has FSDP1's surface read (its
    state dict, `.module`, `.world_size`, ...) where no rule took it for an FSDP1 model's (a module naming no FSDP,
    a parameter of unknown origin): site -> where; FSDP2 would answer otherwise there (shards) or fail (no such
    attribute). reached: site -> the files its model may be used in, each with the functions there it is handed to
    (ANYWHERE: any); None: anywhere (it escapes). state_reads:
    (path, Position) of a FileFacts.state_reads call, or of a STATE_METHODS read in a file not parsed, -> the
    constructors whose model reaches it. entered: the files models that go out of sight were followed into,
    where they may meet any code of the file."""
    by_path = {f.path: f for f in facts}
    for file in facts:
        for table in (file.uses, file.staying):
            for key, use in table.items():
                table[key] = replace(use, sites=frozenset((file.path, p) for p in use.ties))

    def tie(path: str, functions, site) -> None:
        target = by_path.get(path)
        for table in (target.uses, target.staying) if target is not None else ():
            for key, use in table.items():
                if use.function in functions:
                    table[key] = replace(use, sites=use.sites | {site})

    unseen: dict = {}
    reached: dict = {}
    state_reads: dict = {}
    entered: set = set()  # the files models that go out of sight were followed into first

    def follow(site, path: str, reach: Reach) -> bool:
        """Ties what the model of `site` reaches from `path` to it; False when it goes out of sight."""
        steps = [(remote, remote_calls.reach(path, remote)) for remote in sorted(reach.remotes, key=repr)]
        found = [step for remote, step in steps if step is not None or not remote.parameters]  # parameters out of sight
        for where, step in [(path, reach), *(f for f in found if f is not None)]:
            tie(where, step.callees, site)
            reached[site].setdefault(where, set()).update(step.callees)
            served = by_path[where].state_reads if _parsed(by_path.get(where)) else None
            for position, attribute in step.fsdp1_reads:
                if position in served if served is not None else attribute in STATE_METHODS:
                    state_reads.setdefault((where, position), set()).add(site)
            missed = _unseen(by_path.get(where), step.fsdp1_reads, where)
            if missed:
                unseen.setdefault(site, missed)
        return None not in found

    for file in facts:
        for position in file.constructors:
            site = (file.path, position)
            reached[site] = {file.path: {ANYWHERE}}  # in its own file, any function may see it (a global, self)
            own = Reach(
                file.callees.get(position, frozenset()),
                file.remotes.get(position, frozenset()),
                fsdp1_reads=file.fsdp1_reads.get(position, frozenset()),
            )
            if not follow(site, file.path, own):
                file.escaping.add(position)
            name = file.factories.get(position)
            if name is not None and position not in file.escaping:
                callers = factory_callers(remote_calls, sources, file.path, name, entered=entered) if sources is not None else None
                for path, function, reach in callers if callers is not None else ():
                    tie(path, {function}, site)  # the caller's own uses of the model it gets
                    if reach.importable and path in imported:
                        callers = None
                        break
                    reached[site].setdefault(path, set()).add(function)
                    if not follow(site, path, reach):
                        callers = None
                        break
                if callers is None:
                    file.escaping.add(position)
            if position in file.escaping:
                entered.update(reached[site])
                if position in file.holders and sources is not None:  # `trainer = Trainer(model)`, `trainer.model`
                    word = re.compile(rb"\b" + re.escape(file.holders[position].encode()) + rb"\b")
                    entered.update(path for path, data in sources.items() if word.search(data))
                reached[site] = None
    return unseen, reached, state_reads, entered


class Gate:
    """What the rules of one file ask before converting: records the facts, applies a verdict.

    Without a verdict (the first rewrite) everything the file itself allows
    converts; with one, what the program decided.
    """

    def __init__(self, ctx, verdict: Verdict | None) -> None:
        self.ctx = ctx
        self.verdict = verdict
        self.facts = FileFacts(
            ctx.path,
            imports_fsdp1=_imports_fsdp1(ctx),
            declared=declarations(ctx.module),
            script=any(is_main_guard(statement) for statement in ctx.module.body),
        )
        self._replicating: set = set()  # Positions of this file's constructors sharding nothing (NO_SHARD)

    def constructor(
        self,
        node,
        converts: bool,
        stack,
        reads: frozenset = frozenset(),
        part_of_world: bool = False,
        flat_names: bool = True,
        module=None,
        keeps_parameters: bool = False,
        replicates: bool = False,
    ) -> str | None:
        """Why the constructor `node` (at `stack`) must stay FSDP1 although it could convert, if it must.
        `reads`: its keywords whose values a helper reads at run time, in their FSDP1 or FSDP2 form;
        `part_of_world`: it may shard its model over some ranks only;
        `flat_names`: FSDP1 named its model's flat parameters (use_orig_params was not True);
        `keeps_parameters`: FSDP1 kept the module's Parameter objects (use_orig_params may be True);
        `replicates`: its strategy is NO_SHARD, so every rank held whole parameters (Gate.replicated);
        `module`: the module it wraps, which may hold models sharded before (`model[i] = FSDP(model[i])`, then
        `FSDP(model)`): FSDP1 cannot wrap FSDP2's DTensor parameters, nor FSDP2 FSDP1's flat ones, so those
        constructors stand or fall with this one."""
        position = self.ctx.position(node)
        self.facts.part_of_world |= part_of_world and converts
        self.facts.flat_names |= flat_names and converts
        self.facts.constructors[position] = converts
        if replicates:
            self._replicating.add(position)
        self.facts.reads[position] = reads
        function = next((n for n in reversed(stack) if isinstance(n, (cst.FunctionDef, cst.ClassDef))), None)
        self.facts.places[position] = f"{function.name.value}()" if isinstance(function, cst.FunctionDef) else ""
        if self.verdict is None:  # a constructor that stays also ties its model's uses to it: they are blocked by it
            reach = escapes(self.ctx, node, stack)
            if reach is None or reach.escaped:
                self.facts.escaping.add(position)
                owner = None
                if isinstance(function, cst.FunctionDef):
                    owner = method_owner(function, stack[: next(i for i, n in enumerate(stack) if n is function) + 1])
                if owner is not None:
                    self.facts.holders[position] = owner.name.value
            elif reach.importable:
                self.facts.module_level.add(position)
            elif reach.returns:
                self.facts.factories[position] = factory(stack)
            if reach is not None and reach.callees:
                self.facts.callees[position] = reach.callees
            if reach is not None and reach.fsdp1_reads:
                self.facts.fsdp1_reads[position] = reach.fsdp1_reads
            if reach and reach.remotes:
                self.facts.remotes[position] = reach.remotes
            wrapped = handed(self.ctx, module, stack) if keeps_parameters and converts else None
            if wrapped is not None:
                self.facts.wraps_handed[position] = wrapped
            if module is not None:
                self._tie(self._origins(module, stack, wrapped=True)[0] | {position}, node, stack)
                if not fsdp_models(self.ctx).built_in_sight(module, stack):
                    self.facts.wraps_unseen.add(position)
        if not converts or self.verdict is None:
            return None
        return self.verdict.blocked.get(position)

    def meet(self) -> None:
        """Record the statements of the file where models of several of its constructors meet (`ema(student,
        teacher)`, a loop over both models' parameters): they stand or fall together, as FSDP2's DTensor
        parameters do not mix with an FSDP1 model's plain tensors. Called once the first rewrite is done."""
        if self.verdict is not None or len(fsdp_models(self.ctx).constructors) < 2:
            return
        for node, parents in walk(self.ctx.module):
            if isinstance(node, cst.SimpleStatementLine):
                parts = [node]
            elif isinstance(node, cst.For):
                parts = [node.target, node.iter]
            elif isinstance(node, cst.With):
                parts = list(node.items)
            else:
                continue
            stack = (*parents, node)
            models = {}  # each model the statement names (its longest chain that is one) -> its constructors
            for part in parts:
                for expression, above in walk(part):
                    if isinstance(expression, (cst.Name, cst.Attribute)) and not _chain_inside(expression, above):
                        named = self._named_model(expression, stack)
                        # a model's forward (`policy(x)`) gives plain tensors in both versions: that is no meeting
                        called = above and isinstance(above[-1], cst.Call) and above[-1].func is expression
                        if named is not None and not (called and named[0] is expression):
                            models[dotted(named[0])] = named[1]
            if len(models) > 1:
                self._tie(set().union(*models.values()), node, stack)

    def _named_model(self, chain, stack):
        """(the longest prefix of `chain` that is a model or holds models, their constructors' positions), if any."""
        models = fsdp_models(self.ctx)
        while dotted(chain):
            origins = models.origins(chain, stack) or models.holder_origins(chain, stack)
            if origins is not None and origins.constructors:
                return chain, {self.ctx.position(c) for c in origins.constructors}
            if not isinstance(chain, cst.Attribute):
                return None
            chain = chain.value
        return None

    def _tie(self, ties: set, node, stack) -> None:
        """Constructors (positions) that stand or fall together: a use of no rule's ties them (decide)."""
        if len(ties) > 1:
            self.facts.uses[(self.ctx.position(node), TIE)] = Use(TIE, frozenset(ties), False, _function(stack), False)

    def setting(self, node, reads: frozenset = frozenset(), custom_policy: bool = False, readable: bool = True) -> bool:
        """Record `node`, an FSDP1 setting built apart from its constructors (`bf16 = MixedPrecision(...)`);
        whether the program has it take its FSDP2 form there (decide). `reads`: its keywords whose values
        it takes in their FSDP1 or FSDP2 form. `custom_policy`: no helper reads its FSDP1 form, so the
        constructors it reaches stand or fall together; all stay unless it is `readable` in its FSDP2 form."""
        position = self.ctx.position(node)
        self.facts.settings[position] = reads
        if custom_policy:
            self.facts.custom_policies[position] = readable
        return self.verdict is not None and position in self.verdict.settings

    def only_checkpointing(self, node) -> bool:
        """Whether the wrap policy `node` (recorded by `setting`) reaches only `apply_activation_checkpointing`,
        which takes FSDP1's wrap policies: nothing of FSDP1's sharding to convert or report."""
        return self.verdict is not None and self.ctx.position(node) in self.verdict.checkpointing

    def fsdp1_receiver(self, func) -> bool:
        """Whether the program decided that the unknown receiver of this FSDP1-shaped call (`func`: `x.no_sync`,
        as the first rewrite reported it) is an FSDP1 model."""
        return self.verdict is not None and self.ctx.position(func) in self.verdict.fsdp1_receivers

    def state_read(self, func) -> bool:
        """Record that `func` (`m.state_dict` or `m.load_state_dict` of a call a helper can make for any module, on
        a receiver of unknown origin) needs no rule to know its model; whether the program decided that an FSDP1
        model converting to FSDP2 reaches it, so that it takes the helper."""
        position = self.ctx.position(func)
        self.facts.state_reads.add(position)
        return self.verdict is not None and position in self.verdict.state_reads

    def dispatch(self, func) -> bool:
        """Whether the FSDP1-shaped call `func` (`model.no_sync`) on a receiver of unknown origin takes a helper
        that serves any module (FSDP1's method for all but an FSDP2 module): yes, unless no FSDP1 model that
        converts may reach this file (none is handed to it or goes out of sight), when the helper would only add
        code. It needs no model to convert with it."""
        self.facts.dispatched = True
        return self.verdict is None or not self.verdict.unreached

    def may_build_fsdp1(self) -> bool:
        """Whether a model this file cannot see may be torch's FSDP1 model: only when the program
        uses torch's FSDP1 somewhere (a `.no_sync()` in a DDP, fairscale or Megatron program is theirs)."""
        if self.facts.imports_fsdp1 or self.facts.constructors or fsdp_models(self.ctx).constructors:
            return True
        if self.verdict is not None:
            return self.verdict.builds_fsdp1
        # The first rewrite assumes it does, so that what it records holds models back; a program that
        # builds none has the file rewritten again (Verdict.assumed).
        self.facts.asked_about_fsdp1 = True
        return True

    def part_of_world(self) -> bool:
        """Whether a model of the program may be sharded over some ranks only, so that FSDP1's `rank0_only`
        (rank 0 of the model's group) is not FSDP2's StateDictOptions (the world's rank 0). The first rewrite
        answers for this file; the program's answer has the file rewritten again (Verdict.part_of_world)."""
        self.facts.asked_about_world = True
        return self.facts.part_of_world or (self.verdict is not None and self.verdict.part_of_world)

    def flat_names(self) -> bool:
        """Whether a model of the program that converts had FSDP1 name its flat parameters (use_orig_params not
        True), so that names read of a model of unknown origin may change. The first rewrite assumes so (most
        programs do); a program where none did has the file rewritten again (Verdict.original_names)."""
        self.facts.asked_about_names = True
        return self.verdict is None or not self.verdict.original_names

    def tags_parameters(self) -> bool:
        """Whether a file of the program sets attributes of its own on parameters, which FSDP1 with
        use_orig_params=True kept and fully_shard's new parameters lack. Answered as part_of_world is."""
        self.facts.asked_about_tags = True
        if self.verdict is not None and self.verdict.tags_parameters:
            return True
        return tags_parameters(self.ctx.text.encode("utf-8", "replace"))  # this file's own answer, asked rarely

    def stays(self, node, code: str, stack, unsure: bool = False, fsdp1_only: bool = False, any_model: bool = False) -> None:
        """Record that a rule leaves the FSDP1 use `node` as it is: the models that reach it stay FSDP1 with it.
        A call of the FSDP class's own API (`FSDP.state_dict_type(m, ...)`) takes an FSDP1 model, whatever this
        file can trace of it, and so does a read of what only an FSDP1 model has (`fsdp1_only`); a call shaped
        like FSDP1's on a receiver nothing is known of may (`unsure`). A read of an optimizer's parameters (`any_model`)
        may meet every model of the files it runs with, out of sight or not: their optimizers are built there."""
        self._record_staying(node, code, stack, unsure, fsdp1_only or any_model, any_model)

    def _record_staying(self, node, code: str, stack, unsure: bool, fsdp1_only: bool, any_model: bool) -> None:
        if self.verdict is not None or self.ctx.dual_versions.holds(stack):
            return
        ties, untied, _ = self._origins(node, stack)
        if not ties and (unsure or fsdp1_only or _takes_an_fsdp1_model(self.ctx, node) or self._checked_fsdp1(node, stack)):
            untied = True
        if ties or untied:
            use = Use(
                code, frozenset(ties), untied, _function(stack), _handed_in(node, stack), unsure=unsure and not ties, any_model=any_model
            )
            self.facts.staying[(self.ctx.position(node), code)] = use

    def _checked_fsdp1(self, node, stack) -> bool:
        """`node` runs only where `isinstance(m, FSDP)` holds for a model it names: it takes an FSDP1 model."""
        inside = (*stack, node) if not stack or stack[-1] is not node else stack
        return any(checked_instance(self.ctx, inside, dotted(e), FSDP_CLASS) for e in _model_expressions(node))

    def _origins(self, node, stack, wrapped: bool = False) -> tuple[set, bool, bool]:
        """(positions of the constructors, a model out of sight, an FSDP2 module) that may reach `node`; `wrapped`:
        `node` is the module an FSDP(...) wraps."""
        models = fsdp_models(self.ctx)
        ties, untied, fsdp2 = set(), False, False
        for expression in _model_expressions(node):  # in the module an FSDP(...) wraps, each holds modules
            origins = models.origins(expression, stack) or models.holder_origins(expression, stack, wrapped)
            if origins is not None:
                ties |= {self.ctx.position(c) for c in origins.constructors}
                untied = untied or origins.untied
                fsdp2 = fsdp2 or origins.fsdp2
        return ties, untied, fsdp2

    def replicated(self, node, stack) -> bool:
        """Whether every model that may reach `node` is one of this file's NO_SHARD constructors' (whole parameters
        on every rank, under FSDP1 as under FSDP2)."""
        ties, untied, fsdp2 = self._origins(node, stack)
        return bool(ties) and not untied and not fsdp2 and ties <= self._replicating

    def traced(self, node) -> bool:
        """Whether the program traced every model that may reach the dispatchable use `node` to a constructor
        that converts (Use.dispatchable): it converts as their use, with no helper."""
        return self.verdict is not None and self.ctx.position(node) in self.verdict.traced

    def use(
        self,
        node,
        code: str,
        stack,
        lasting: bool = False,
        governed: bool = False,
        dispatchable: bool = False,
        fsdp2_default: bool = False,
    ) -> Denial | None:
        """Why the FSDP1 use `node` (original, at `stack`) must not become FSDP2 code, if it must not. `lasting`: a
        state-dict type it sets stays on the model after it (the program checks no state dict is read out of sight);
        `governed`: it is in (or is) a `with FSDP.state_dict_type(...)` block, so no type set for good reaches it;
        `fsdp2_default`: the type it sets is the one FSDP2's own `state_dict()` reads as (Use.fsdp2_default)."""
        ctx = self.ctx
        if ctx.dual_versions.holds(stack):
            return Denial(DUAL_VERSION, "already serves FSDP1 and FSDP2; left as is")
        ties, untied, fsdp2 = self._origins(node, stack)
        if fsdp2:
            if ties or untied:
                return Denial(DUAL_VERSION, "the model may be FSDP1 or FSDP2 here; left as is")
            if not any(ctx.fsdp1_names(e) for e in _model_expressions(node)):
                return Denial(None, "an FSDP2 module's own method: nothing of FSDP1 to convert")
            return None  # FSDP1 API called on an FSDP2 module: its FSDP2 form is what works
        key = (ctx.position(node), code)
        self.facts.uses[key] = Use(
            code,
            frozenset(ties),
            untied or not ties,
            _function(stack),
            _handed_in(node, stack),
            lasting=lasting,
            governed=governed,
            dispatchable=dispatchable,
            fsdp2_default=fsdp2_default,
        )
        return self.verdict.denied.get(key) if self.verdict is not None else None


def _chain_inside(node, above) -> bool:
    """`node` is part of a longer attribute chain (`student` in `student.parameters`)."""
    return bool(above) and isinstance(above[-1], cst.Attribute) and above[-1].value is node


def _function(stack) -> str:
    return next((n.name.value for n in reversed(stack) if isinstance(n, cst.FunctionDef)), "")


def _handed_in(node, stack) -> bool:
    """Whether a name in `node` is a parameter of the innermost function holding it."""
    function = next((n for n in reversed(stack) if isinstance(n, cst.FunctionDef)), None)
    if function is None:
        return False
    params = function.params
    names = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
    names |= {p.name.value for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)}
    return any(isinstance(child, cst.Name) and child.value in names for child, _ in walk(node))


def _takes_an_fsdp1_model(ctx, node) -> bool:
    return isinstance(node, cst.Call) and bool(node.args) and any(
        name.startswith(FSDP_CLASS + ".") for name in ctx.fsdp1_names(node.func)
    )


def _model_expressions(node):
    """The names and attribute chains in `node` (each prefix of a chain too): where a model can be named."""
    for child, _ in walk(node):
        if isinstance(child, (cst.Name, cst.Attribute)) and dotted(child):
            yield child


def _imports_fsdp1(ctx) -> bool:
    """The file imports a name of torch's FSDP1 (a cheap text test first: most files name none)."""
    if "fsdp" not in ctx.text:
        return False
    return any(is_fsdp1(canonical(qualified)) for qualified, _ in import_aliases(ctx.module))
