-- Adds the outbox table to an existing CDC publication that lacks it.
ALTER PUBLICATION {{publication}} ADD TABLE {{table}}
