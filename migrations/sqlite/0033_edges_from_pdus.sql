-- The DAG edges are read from the stored PDUs (docs/federation-storage.md,
-- "DAG edges"): an event's prev_events and auth_events are in its `json`, in
-- `events` or `outliers`, and nothing is lost by dropping the tables that
-- copied them. Each placed event wrote rows keyed by random event ids into
-- two B-trees and an index, which made every local send dirty three more
-- random pages; the readers (auth chains, the bottom of a backfilled line)
-- read the ids from the PDU of each event they visit instead.
DROP INDEX event_edges_by_prev;
DROP TABLE event_edges;
DROP TABLE event_auth_edges;
