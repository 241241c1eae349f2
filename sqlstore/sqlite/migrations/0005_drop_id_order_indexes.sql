-- Listings read a user's tasks in (created_at, id) order since version 4,
-- through tasks_owner_created and watchers_user_created, which serve every
-- lookup by owner or by watcher that the (owner, id) and (user_id, task_id)
-- indexes served. Those two are dropped: each cost every insert one more
-- index entry. (A watcher's check of one task reads the primary key.)
DROP INDEX {schema}"{prefix}tasks_owner";
DROP INDEX {schema}"{prefix}watchers_user";
