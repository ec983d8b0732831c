//! Who may use which queue.
//!
//! Three privileges, per queue: `produce` (push), `consume` (pop, ack, extend a lease, read
//! dead letters) and `admin` (everything else about the queue, and both of the others).
//!
//! - A member of `queen_producer`, `queen_consumer` or `queen_admin` (roles the extension
//!   creates) has that privilege on every queue; a superuser has all of them.
//! - `queen.grant(queue, role, privilege)` gives a role one privilege on one queue (and
//!   `queen.revoke` takes it back). Such a role needs no queen role: `grant` makes it a
//!   member of `queen_grantee`, which holds USAGE on the schema and EXECUTE on every API
//!   function, and whose members are limited to their granted queues (to none after the
//!   last one goes: the membership stays). A member (or a role that holds grants, or has
//!   the privileges of one that does) gets `42501` for a pop, a push, an ack, a read of
//!   dead letters or an admin call on another queue, or for a privilege it was not
//!   granted; the calls that list queues (`queen.dlq`, `status`, `totals`, `metrics`
//!   without a queue) show only its queues. Encrypted payloads are decrypted only for a
//!   role that may consume the queue.
//! - A role given EXECUTE on queen's functions directly (the "finer grants" of 0.3.0),
//!   not a member of `queen_grantee` and holding no grant, keeps what it had: each
//!   function it may execute itself, on every queue (`executes`: on the function the
//!   application called, which a function manager hook notes).
//!
//! **One mark.** The rights `grant` gives and the mark that limits a role are one
//! membership (and `grant` takes back EXECUTE given to the role itself), so a restore
//! cannot keep one and lose the other: one that fails the copy of `queen.queue_grants` (a
//! grantee role missing in the new cluster) leaves its roles members with no grant,
//! refused everywhere; one that brings no membership (roles made by hand) leaves them
//! without queen's functions.
//!
//! **Whose privileges.** queen's functions run as the extension's owner (SECURITY
//! DEFINER), so the check uses the role of the session at the outer level (the login
//! role, or the role a `SET ROLE` chose) and the role of each SECURITY DEFINER function of
//! the application in between (its owner; `callers`): each must have the privilege, so
//! such a function does not lend its owner's privileges to the session, nor the session's
//! to its owner for the code it runs itself (what PostgreSQL runs as the session on its
//! behalf, as deferred triggers, `callers` says). Inside a security-restricted operation
//! (an index expression run by ANALYZE or autovacuum, a materialized view's refresh) and
//! in a parallel worker every check is refused: the code runs as a role queen cannot
//! see.
//!
//! Every entry point checks, before it touches the queue (`require`, `require_id`,
//! `permitted`); the checks read `queen.queue_grants` only for roles that are members of
//! no queen role, and keep the answer per backend until a grant changes.
//!
//! **Checked twice.** A call checks by the queue's name when it starts, then again by id
//! on the queue it locks or reads (`require_id`, `lock_queue`, `ensure_queue_locked_for`,
//! `checked_queue_id`), and acts on that id: the queue may have been deleted, or deleted
//! and created again under its name, in between, and a role granted the old queue has no
//! grant on the new. A call that waited for a `delete_queue` creates the queue anew only
//! for a role that may create queues.

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::PgSqlErrorCode;
use smallvec::{smallvec, SmallVec};

use crate::pg::errors::{self, SpiExt};
use crate::pg::spi::{first_value, run};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Privilege {
    Produce,
    Consume,
    Admin,
}

impl Privilege {
    pub fn as_str(self) -> &'static str {
        match self {
            Privilege::Produce => "produce",
            Privilege::Consume => "consume",
            Privilege::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Privilege {
        match s {
            "produce" => Privilege::Produce,
            "consume" => Privilege::Consume,
            "admin" => Privilege::Admin,
            other => errors::invalid("privilege", format_args!("{other:?} (must be produce, consume or admin)")),
        }
    }

    /// Every privilege, each with a role of its own.
    pub const ALL: [Privilege; 3] = [Privilege::Produce, Privilege::Consume, Privilege::Admin];

    /// The role that has this privilege on every queue.
    pub fn global_role(self) -> &'static CStr {
        match self {
            Privilege::Produce => c"queen_producer",
            Privilege::Consume => c"queen_consumer",
            Privilege::Admin => c"queen_admin",
        }
    }

    /// `global_role`'s name as text.
    pub fn role_name(self) -> &'static str {
        self.global_role().to_str().expect("ASCII")
    }
}

/// The role `grant` makes a role a member of (see the module docs): EXECUTE on every API
/// function, and the mark of a role limited to its queue grants.
pub const GRANTEE_ROLE: &CStr = c"queen_grantee";

/// Whether `role` is one of the roles queen ships: the three whose members reach every
/// queue, or `queen_grantee` (a grant to it would be a grant to every limited role).
pub fn is_queen_role(role: &str) -> bool {
    Privilege::ALL.iter().any(|p| p.role_name() == role) || GRANTEE_ROLE.to_str() == Ok(role)
}

/// `GRANTEE_ROLE`'s OID, or InvalidOid if it was dropped or renamed.
fn grantee_role_oid() -> pg_sys::Oid {
    // SAFETY: a syscache lookup by name; missing_ok.
    unsafe { pg_sys::get_role_oid(GRANTEE_ROLE.as_ptr(), true) }
}

/// The session's role, at the outer level (see the module docs).
fn session_role() -> pg_sys::Oid {
    // SAFETY: a plain read of the outer user id.
    unsafe { pg_sys::GetOuterUserId() }
}

/// The roles a check asks about: the session's and a few between it and queen, inline.
type Roles = SmallVec<[pg_sys::Oid; 4]>;

/// The roles whose privileges a call needs, each of them: the session's role, and the
/// role each function between the session and queen runs as (an application's SECURITY
/// DEFINER function runs as its owner; `entered` notes them), so that such a function
/// neither lends its owner's privileges to the session nor the session's to its owner.
/// Refused (42501) inside a security-restricted operation (an index expression or a
/// function run by ANALYZE, VACUUM or autovacuum, CREATE INDEX, REFRESH MATERIALIZED
/// VIEW): PostgreSQL runs that code as the table's owner, a role queen cannot see, while
/// the session's role is whoever started the operation; and in a parallel worker, which
/// has none of the leader's frames. Not seen, and so not asked: the role of code that
/// PostgreSQL switches to without a function call (a foreign key's cascade runs the
/// referencing table's triggers as its owner) or after the frame ended (a cursor opened in
/// a SECURITY DEFINER function, fetched later). Those run with the session's rights in
/// PostgreSQL too, as do deferred triggers queued by a SECURITY DEFINER function: calling
/// an untrusted role's code is not safe, with or without queen.
fn callers(p: Privilege) -> Roles {
    // SAFETY: a plain read of this process's parallel worker number.
    if unsafe { pg_sys::ParallelWorkerNumber } >= 0 {
        // A parallel worker runs an application function the leader's query called (queen's
        // own are PARALLEL UNSAFE), as the role the leader ran it as, which the worker has no
        // frame for.
        errors::raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("queen: permission denied to {} in a parallel worker (call queen from the leader: mark a function that calls it PARALLEL UNSAFE)", p.as_str()),
        );
    }
    // SAFETY: a plain read of the security context.
    if unsafe { pg_sys::InSecurityRestrictedOperation() } {
        errors::raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "queen: permission denied to {} inside a security-restricted operation (an index expression, ANALYZE, VACUUM, CREATE INDEX, REFRESH MATERIALIZED VIEW): that code runs as a table's owner, whose privileges queen cannot check",
                p.as_str()
            ),
        );
    }
    let mut roles = smallvec![session_role()];
    ENTERED.with(|e| {
        for frame in e.borrow().iter().take_while(|f| !f.queen) {
            if !roles.contains(&frame.user) {
                roles.push(frame.user);
            }
        }
    });
    roles
}

/// Whether `role` has `p` on every queue: a superuser, a member of the queen role, or a
/// role not limited to queue grants that holds EXECUTE itself on the queen function the
/// application called (the 0.3.0 model: its EXECUTE rights limit it, function by
/// function). Itself: a role that reaches a queen function only through an application's
/// SECURITY DEFINER function, whose owner holds EXECUTE on it, gets only what its own
/// grants give it (none: 42501), not every queue with the wrapper owner's EXECUTE.
fn global(role: pg_sys::Oid, p: Privilege) -> bool {
    // (`executes` asks about the function, whatever `p`: what a 0.3.0 role may call it may
    // do on every queue.)
    queen_role(role, p) || (!limited(role) && executes(role))
}

/// Whether `role` holds EXECUTE on the queen function this call runs in, the outermost
/// one (`entry`), directly, through roles it has the privileges of, or through PUBLIC (as
/// PostgreSQL checks it, live: a change of rights counts at once). What that function
/// does inside counts as part of it: the push of a `dlq_replay` needs only EXECUTE on
/// `dlq_replay`. Not known (no queen function seen): false.
fn executes(role: pg_sys::Oid) -> bool {
    let Some(f) = entry() else { return false };
    // SAFETY: a catalog lookup and ACL check by OID; a function dropped meanwhile is an
    // ERROR (42883), which fails closed.
    unsafe {
        pg_sys::pg_proc_aclcheck(f, role, pg_sys::ACL_EXECUTE as pg_sys::AclMode) == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// A function run through `fmgr_security_definer` starts (every SECURITY DEFINER
/// function, and every one with a SET clause, which all of queen's API functions are):
/// called by `hooks`' function manager hook with whether it is one of queen's, and the
/// role it runs as.
pub fn entered(f: pg_sys::Oid, queen: bool, user: pg_sys::Oid) {
    ENTERED.with(|e| e.borrow_mut().push(Frame { f, queen, user }));
}

/// A function ends or raises (the hook): forgotten if it is the innermost one entered.
pub fn left(f: pg_sys::Oid) {
    ENTERED.with(|e| {
        let mut e = e.borrow_mut();
        if e.last().is_some_and(|last| last.f == f) {
            e.pop();
        }
    });
}

/// At a transaction's end (commit, abort, prepare): nothing is running. Every function
/// has left by then (one that raised, too); what remains is the frame of a call that
/// loaded the library (`hooks::init`), which goes here.
pub fn forget_entries() {
    ENTERED.with(|e| e.borrow_mut().clear());
}

/// The queen function the application called: the outermost queen function entered.
fn entry() -> Option<pg_sys::Oid> {
    ENTERED.with(|e| e.borrow().iter().find(|f| f.queen).map(|f| f.f))
}

/// A function running through `fmgr_security_definer` (`entered`); or, with `f` invalid,
/// the role a call that loaded the library ran as (`hooks::init`, without preloading),
/// which stands for the frames before the hook existed until the transaction ends.
#[derive(Clone, Copy)]
struct Frame {
    f: pg_sys::Oid,
    /// One of queen's functions.
    queen: bool,
    /// The role it runs as: its owner for a SECURITY DEFINER function, else its caller's.
    user: pg_sys::Oid,
}

/// `f`, the PL/pgSQL function of queen (`status`, `totals`, `dlq`, `metrics`,
/// `delete_queue`) that called the internal one running `check` (`_require`,
/// `_permitted_queues`), as a frame while `check` runs, when its own frame was never
/// recorded: the library (and its hook) was loaded inside it, in a backend without
/// `shared_preload_libraries`. Taken back however `check` ends.
fn with_entry<T>(f: pg_sys::Oid, check: impl FnOnce() -> T) -> T {
    /// The index the frame went in at, if it did.
    struct Leave(Option<usize>);
    impl Drop for Leave {
        fn drop(&mut self) {
            if let Some(at) = self.0 {
                ENTERED.with(|e| {
                    let mut e = e.borrow_mut();
                    if at < e.len() {
                        e.remove(at);
                    }
                });
            }
        }
    }
    // The internal function itself is the only queen frame: its caller goes right before it.
    let _leave = Leave(ENTERED.with(|e| {
        let mut e = e.borrow_mut();
        if e.iter().filter(|f| f.queen).count() > 1 {
            return None;
        }
        let at = e.len().saturating_sub(1);
        // SAFETY: a plain read of the current user id (the owner, inside queen).
        e.insert(at, Frame { f, queen: true, user: unsafe { pg_sys::GetUserId() } });
        Some(at)
    }));
    check()
}

/// Whether `role` is limited to its queue grants: a member of `queen_grantee` (directly or
/// through other roles, with or without INHERIT), or a role that holds a grant (or has
/// the privileges of one that does). A role whose last grant went stays a member, limited
/// to no queue: it keeps EXECUTE on every queen function through the membership, and
/// unlimited it would reach every queue with them. Every role is limited when
/// `queen_grantee` cannot be found by its name (dropped, or renamed: its members would
/// otherwise hold EXECUTE through it with nothing to limit them). (A superuser is a
/// member of every role, but `queen_role` answers for it first.)
fn limited(role: pg_sys::Oid) -> bool {
    let grantee = grantee_role_oid();
    // SAFETY: a membership test (cached by PostgreSQL).
    if grantee == pg_sys::InvalidOid || unsafe { pg_sys::is_member_of_role(role, grantee) } {
        return true;
    }
    let holders = crate::pg::cache::cached(
        &LIMITED,
        (),
        || {
            Some(Spi::connect_mut(|client| {
                run(client, "SELECT DISTINCT grantee::oid FROM queen.queue_grants", &[])
                    .map(|r| r.get::<pg_sys::Oid>(1).or_raise().unwrap())
                    .collect::<Vec<_>>()
            }))
        },
        |_| true,
    )
    .unwrap_or_default();
    // SAFETY: membership tests (cached by PostgreSQL); a dropped role matches nothing.
    holders.into_iter().any(|g| unsafe { pg_sys::has_privs_of_role(role, g) })
}

/// Makes `role` (named `name`) a member of `queen_grantee`, unless it is one already: the
/// rights a queue grant needs, and the mark that limits it (`limited`). And takes back
/// any EXECUTE on queen's functions given to the role itself: the membership gives it
/// what it needs, and a direct right would make the role a 0.3.0 one (every queue) in a
/// restore into a cluster that lacks the membership. One grant of a role at a time
/// (`locks::privileges`): two first grants at once would both add the membership, and
/// the second fail on `pg_auth_members`' unique key. The membership is looked up in the
/// catalog cache, which that lock brought up to date, so this holds under REPEATABLE READ
/// too.
pub fn make_grantee(client: &mut SpiClient<'_>, role: pg_sys::Oid, name: &str) {
    crate::pg::locks::privileges(role);
    let grantee = grantee_role_oid();
    if grantee == pg_sys::InvalidOid {
        errors::raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            "queen: the role queen_grantee does not exist (CREATE EXTENSION and ALTER EXTENSION queen UPDATE make it)"
                .into(),
        );
    }
    // SAFETY: a syscache lookup of pg_auth_members by its key (roleid = queen_grantee,
    // member = the role); PostgreSQL 15's key has these two columns (16 adds the grantor).
    let member = unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::AUTHMEMROLEMEM as i32,
            pg_sys::Datum::from(grantee),
            pg_sys::Datum::from(role),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
        )
    };
    let who = format!("\"{}\"", name.replace('"', "\"\""));
    if !member {
        let grantee = GRANTEE_ROLE.to_str().expect("ASCII");
        crate::pg::spi::run_built(client, &format!("GRANT {grantee} TO {who}"));
    }
    // Only the functions the role holds EXECUTE on itself, one change of their rights at a
    // time (`locks::function_rights`): each REVOKE rewrites the function's catalog row.
    let mut direct = || -> Vec<String> {
        run(
            client,
            "SELECT DISTINCT p.oid::regprocedure::text
               FROM pg_catalog.pg_proc p CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
              WHERE p.pronamespace = 'queen'::regnamespace AND a.privilege_type = 'EXECUTE' AND a.grantee = $1
              ORDER BY 1",
            &[role.into()],
        )
        .map(|r| r.get::<String>(1).or_raise().unwrap())
        .collect()
    };
    // (Not for a superuser, who needs no rights: its entries, the owner's among them, stay.)
    // SAFETY: a syscache lookup of the role.
    if !unsafe { pg_sys::superuser_arg(role) } && !direct().is_empty() {
        crate::pg::locks::function_rights();
        let functions = direct().join(", ");
        if !functions.is_empty() {
            crate::pg::spi::run_built(client, &format!("REVOKE EXECUTE ON FUNCTION {functions} FROM {who}"));
        }
    }
}

/// Whether every role a call needs (`callers`) has `p` on every queue through a queen role
/// (or superuser): for `grant`, `revoke`.
pub fn queen_roles(p: Privilege) -> bool {
    callers(p).iter().all(|&r| queen_role(r, p))
}

/// Whether `role` has `p` on every queue through a queen role (or superuser).
fn queen_role(role: pg_sys::Oid, p: Privilege) -> bool {
    // SAFETY: catalog lookups (cached by PostgreSQL); a missing role is InvalidOid.
    unsafe {
        if pg_sys::superuser_arg(role) {
            return true;
        }
        let has = |name: &CStr| {
            let r = pg_sys::get_role_oid(name.as_ptr(), true);
            r != pg_sys::InvalidOid && pg_sys::has_privs_of_role(role, r)
        };
        has(p.global_role()) || (p != Privilege::Admin && has(Privilege::Admin.global_role()))
    }
}

thread_local! {
    /// Per backend: (role, queue id, privilege) -> allowed, while no grant changed
    /// (`cache::cached`: grants send the queues' invalidation).
    static ALLOWED: crate::pg::cache::Settings<(u32, i64, Privilege), bool> = Default::default();
    /// The functions running through `fmgr_security_definer`, outermost first (`entered`,
    /// `left`).
    static ENTERED: std::cell::RefCell<Vec<Frame>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Per backend: every role that holds a queue grant, while no grant changed.
    static LIMITED: crate::pg::cache::Settings<(), Vec<pg_sys::Oid>> = Default::default();
}

/// Whether `role` has `p` on queue `queue_id` through `queen.grant` (or `admin` there).
fn granted(client: &mut SpiClient<'_>, role: pg_sys::Oid, queue_id: i64, p: Privilege) -> bool {
    let read = || {
        let grantees: Vec<pg_sys::Oid> = run(
            client,
            "SELECT grantee::oid FROM queen.queue_grants WHERE queue_id = $1 AND privilege IN ($2, 'admin')",
            &[queue_id.into(), p.as_str().into()],
        )
        .map(|r| r.get::<pg_sys::Oid>(1).or_raise().unwrap())
        .collect();
        // SAFETY: a membership test (cached by PostgreSQL); a dropped role matches nothing.
        Some(grantees.into_iter().any(|g| unsafe { pg_sys::has_privs_of_role(role, g) }))
    };
    crate::pg::cache::cached(&ALLOWED, (role.to_u32(), queue_id, p), read, |_| true).unwrap_or(false)
}

pub fn denied(what: &str, p: Privilege) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!("queen: permission denied to {} {what}", p.as_str()),
    )
}

/// Checks that the caller has `p` on `queue` (by name); with `None`, on every queue.
/// `42501` otherwise. A queue that does not exist is refused to a role without the
/// global privilege (it could not have been granted on it).
pub fn require(queue: Option<&str>, p: Privilege) {
    let roles = callers(p);
    if roles.iter().all(|&r| global(r, p)) {
        return;
    }
    let Some(queue) = queue else { denied("every queue", p) };
    let ok = Spi::connect_mut(|client| {
        let id = crate::queue::lookup::queue_id(client, queue);
        id.is_some_and(|id| roles.iter().all(|&r| global(r, p) || granted(client, r, id, p)))
    });
    if !ok {
        denied(&format!("queue {queue:?}"), p);
    }
}

/// `require` for a queue named by the caller, whose name has not been checked yet (the
/// PL/pgSQL functions status, totals, dlq and delete_queue, through `_require`; `grants`):
/// a name no queue can have is a 22023, as from every other entry point, not an empty
/// answer.
pub fn require_named(queue: Option<&str>, p: Privilege) {
    if let Some(q) = queue {
        crate::queue::names::check_queue_name("queue", q);
    }
    require(queue, p);
}

/// `require` for a queue known by id (a lease's, a dead letter's).
pub fn require_id(client: &mut SpiClient<'_>, queue_id: i64, p: Privilege) {
    let roles = callers(p);
    if !roles.iter().all(|&r| global(r, p) || granted(client, r, queue_id, p)) {
        let name =
            first_value::<String>(run(client, "SELECT name FROM queen.queues WHERE queue_id = $1", &[queue_id.into()]));
        denied(&format!("queue {:?}", name.unwrap_or_default()), p);
    }
}

/// A queue's id by name, with `p` checked on it by id (checked twice, module docs), for a
/// call that then acts by id without locking the queue (`retain`, `compact`, `grants`):
/// None when there is no such queue.
pub fn checked_queue_id(client: &mut SpiClient<'_>, name: &str, p: Privilege) -> Option<i64> {
    let id = crate::queue::lookup::queue_id(client, name)?;
    require_id(client, id, p);
    Some(id)
}

/// `lookup::ensure_queue_locked` (which creates a queue deleted meanwhile), then `p`
/// checked on the queue it locked (checked twice, module docs): a role limited to its
/// grants, which may not create a queue, gets 42501 and the creation rolls back with it.
pub fn ensure_queue_locked_for(client: &mut SpiClient<'_>, name: &str, p: Privilege) -> (i64, i32, bool) {
    let found = crate::queue::lookup::ensure_queue_locked(client, name);
    require_id(client, found.0, p);
    found
}

/// An existing queue's id by name, its lock taken in share mode (`locks::share_queue`)
/// and `p` checked on it (checked twice, module docs); None when there is no such queue,
/// or it went while this waited.
pub fn lock_queue(client: &mut SpiClient<'_>, name: &str, p: Privilege) -> Option<i64> {
    let id = crate::queue::lookup::queue_id(client, name).filter(|&id| crate::pg::locks::share_queue(id))?;
    require_id(client, id, p);
    Some(id)
}

/// The queues on which the caller has `p`: None for all (the global privilege).
pub fn permitted(p: Privilege) -> Option<Vec<i64>> {
    let roles = callers(p);
    if roles.iter().all(|&r| global(r, p)) {
        return None;
    }
    Some(Spi::connect_mut(|client| {
        let ids: Vec<i64> = run(client, "SELECT DISTINCT queue_id FROM queen.queue_grants ORDER BY 1", &[])
            .map(|r| r.get::<i64>(1).or_raise().unwrap())
            .collect();
        ids.into_iter().filter(|&id| roles.iter().all(|&r| global(r, p) || granted(client, r, id, p))).collect()
    }))
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._require(text, text, oid) IS
  'queen internal: refuse a bad queue name (22023), and (42501) unless every role the call runs for has the privilege on the queue (NULL: every queue); the third argument is the calling function; not granted';
COMMENT ON FUNCTION queen._permitted_queues(text, oid) IS
  'queen internal: the queues on which every role the call runs for has the privilege, NULL for all; the second argument is the calling function; not granted';
"#,
    name = "require_sql_home",
    requires = [require_sql, permitted_sql]
);

/// `queen._require(queue, privilege, caller)`: `require`, for queen's PL/pgSQL functions,
/// which name themselves (`caller`) for the case `with_entry` covers.
#[pg_extern(name = "_require", volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn require_sql(queue: Option<&str>, privilege: &str, caller: pg_sys::Oid) {
    with_entry(caller, || require_named(queue, Privilege::parse(privilege)));
}

/// `queen._permitted_queues(privilege, caller)`: `permitted`, for queen's PL/pgSQL
/// functions (`caller` as for `_require`).
#[pg_extern(name = "_permitted_queues", volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn permitted_sql(privilege: &str, caller: pg_sys::Oid) -> Option<Vec<i64>> {
    with_entry(caller, || permitted(Privilege::parse(privilege)))
}

/// A role by name: its OID and its name, or 42704.
pub fn role_named(client: &mut SpiClient<'_>, role: &str) -> (pg_sys::Oid, String) {
    let row = run(client, "SELECT oid, rolname::text FROM pg_catalog.pg_roles WHERE rolname = $1", &[role.into()]);
    match row.into_iter().next() {
        Some(r) => (r.get::<pg_sys::Oid>(1).or_raise().unwrap(), r.get::<String>(2).or_raise().unwrap()),
        None => errors::raise(PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT, format!("queen: role {role:?} does not exist")),
    }
}
