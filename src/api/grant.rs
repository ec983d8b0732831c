//! `queen.grant`, `queen.revoke` and `queen.grants`: privileges on single queues
//! (docs/functions.md, "Per-queue privileges"). Who may use which queue, and the checks
//! every entry point makes, are `privileges`'.

use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::json;

use crate::pg::errors::{self, SpiExt};
use crate::pg::spi::run;
use crate::queue::privileges::{denied, make_grantee, queen_roles, role_named, Privilege};

extension_sql!(
    r#"
COMMENT ON FUNCTION queen."grant"(text, text, text) IS
  'queen: give a role one privilege (produce, consume, admin) on one queue, and membership of queen_grantee, which lets it call queen and limits it to its granted queues';
COMMENT ON FUNCTION queen."revoke"(text, text, text) IS
  'queen: take a privilege on a queue back from a role';
COMMENT ON FUNCTION queen.grants(text) IS
  'queen: the privileges granted on queues with queen.grant (of one queue, or all)';
"#,
    name = "grants_home",
    requires = [grant_sql, revoke_sql, grants_sql]
);

/// Checks the arguments of `grant` / `revoke`, which only a global admin may call.
fn grant_args(queue: Option<&str>, role: Option<&str>, privilege: Option<&str>) -> (String, String, Privilege) {
    let queue = queue.unwrap_or_else(|| errors::null_arg("queue"));
    let role = role.unwrap_or_else(|| errors::null_arg("role"));
    let p = Privilege::parse(privilege.unwrap_or_else(|| errors::null_arg("privilege")));
    crate::queue::names::check_queue_name("queue", queue);
    crate::queue::citus::ensure_home(queue);
    if !queen_roles(Privilege::Admin) {
        denied("grant on queues (queen_admin only)", Privilege::Admin);
    }
    // Members of the first three reach every queue; a grant to queen_grantee would be one to
    // every role limited to its grants.
    if crate::queue::privileges::is_queen_role(role) {
        errors::invalid(
            "role",
            format_args!("{role:?} is one of queen's own roles: per-queue privileges are for roles of your own"),
        );
    }
    (queue.to_string(), role.to_string(), p)
}

/// `queen.grant(queue, role, privilege)`: see the module docs. Creates the queue when it
/// does not exist (as `configure` does). Returns whether the grant is new.
#[pg_extern(name = "grant", security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn grant_sql(queue: Option<&str>, role: Option<&str>, privilege: Option<&str>) -> JsonB {
    let (queue, role, p) = grant_args(queue, role, privilege);
    let (name, added) = Spi::connect_mut(|client| {
        let (oid, name) = role_named(client, &role);
        let (queue_id, ..) = crate::queue::privileges::ensure_queue_locked_for(client, &queue, Privilege::Admin);
        let added = !run(
            client,
            "INSERT INTO queen.queue_grants (queue_id, grantee, privilege) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING RETURNING 1",
            &[queue_id.into(), oid.into(), p.as_str().into()],
        )
        .is_empty();
        // From now on the role is limited to its grants, also once none is left.
        make_grantee(client, oid, &name);
        (name, added)
    });
    crate::pg::cache::invalidate();
    JsonB(json!({"queue": queue, "role": name, "privilege": p.as_str(), "granted": added}))
}

/// `queen.revoke(queue, role, privilege)`: takes the privilege back. The role stays a
/// member of `queen_grantee`, limited to the grants it has left (none, perhaps). Returns
/// whether it held it.
#[pg_extern(name = "revoke", security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn revoke_sql(queue: Option<&str>, role: Option<&str>, privilege: Option<&str>) -> JsonB {
    let (queue, role, p) = grant_args(queue, role, privilege);
    let (name, removed) = Spi::connect_mut(|client| {
        let (oid, name) = role_named(client, &role);
        let removed = !run(
            client,
            "DELETE FROM queen.queue_grants g USING queen.queues q
              WHERE q.queue_id = g.queue_id AND q.name = $1 AND g.grantee = $2::oid AND g.privilege = $3
             RETURNING 1",
            &[queue.as_str().into(), oid.into(), p.as_str().into()],
        )
        .is_empty();
        (name, removed)
    });
    crate::pg::cache::invalidate();
    JsonB(json!({"queue": queue, "role": name, "privilege": p.as_str(), "revoked": removed}))
}

/// `queen.grants(queue)`: the grants made with `queen.grant`, of one queue or all.
#[pg_extern(name = "grants", security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn grants_sql(
    queue: default!(Option<&str>, "NULL"),
) -> TableIterator<'static, (name!(queue, String), name!(role, String), name!(privilege, String))> {
    crate::queue::privileges::require_named(queue, Privilege::Admin);
    let rows: Vec<(String, String, String)> = Spi::connect_mut(|client| {
        // Checked again on the queue listed, by id (privileges, module docs).
        let queue_id = match queue {
            Some(q) => match crate::queue::privileges::checked_queue_id(client, q, Privilege::Admin) {
                Some(id) => Some(id),
                None => return Vec::new(),
            },
            None => None,
        };
        run(
            client,
            "SELECT q.name, coalesce(r.rolname::text, g.grantee::oid::text), g.privilege
               FROM queen.queue_grants g JOIN queen.queues q ON q.queue_id = g.queue_id
               LEFT JOIN pg_catalog.pg_roles r ON r.oid = g.grantee::oid
              WHERE $1::int8 IS NULL OR q.queue_id = $1
              ORDER BY 1, 2, 3",
            &[queue_id.into()],
        )
        .map(|r| (r.get(1).or_raise().unwrap(), r.get(2).or_raise().unwrap(), r.get(3).or_raise().unwrap()))
        .collect()
    });
    TableIterator::new(rows)
}
