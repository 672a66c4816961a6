-- The sqlite workload of scripts/realprog.sh (@ROWS@ is replaced by the
-- script): a file database, inserts in a transaction, indexes, joins,
-- aggregates, a view, a trigger, updates and deletes, a CTE, then integrity
-- check and VACUUM.  Deterministic; the output is compared with a plain run.
PRAGMA journal_mode = WAL;
CREATE TABLE person(id INTEGER PRIMARY KEY, name TEXT NOT NULL, age INT, city INT);
CREATE TABLE city(id INTEGER PRIMARY KEY, name TEXT UNIQUE);
CREATE TABLE log(what TEXT, n INT);
CREATE TRIGGER person_del AFTER DELETE ON person BEGIN
	INSERT INTO log VALUES ('del', old.id);
END;
BEGIN;
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 50)
INSERT INTO city(name) SELECT printf('city%03d', i) FROM c;
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < @ROWS@)
INSERT INTO person(name, age, city)
	SELECT printf('p%06d-%s', i, hex(i * 7919 % 1000)), (i * 37) % 90, 1 + (i * 13) % 50 FROM c;
COMMIT;
INSERT INTO person(name, age, city) VALUES ('single one', 33, 7);
INSERT INTO person(name, age, city) VALUES ('single two', 44, 8);
CREATE INDEX person_age ON person(age);
CREATE INDEX person_city_name ON person(city, name);
CREATE VIEW older AS SELECT * FROM person WHERE age > 60;
SELECT count(*), sum(age), min(name), max(name) FROM person;
SELECT c.name, count(*), avg(p.age) FROM person p JOIN city c ON c.id = p.city
	GROUP BY c.name ORDER BY count(*) DESC, c.name LIMIT 5;
SELECT age, count(*) FROM older GROUP BY age ORDER BY age LIMIT 5;
SELECT name FROM person WHERE name LIKE 'p0001%' ORDER BY name DESC LIMIT 3;
SELECT count(*) FROM person WHERE age BETWEEN 20 AND 30 AND city IN (3, 5, 7);
UPDATE person SET age = age + 1 WHERE city % 3 = 0;
DELETE FROM person WHERE id % 17 = 0;
SELECT count(*), sum(n) FROM log;
SELECT group_concat(name, ';') FROM (SELECT name FROM person ORDER BY age DESC, id LIMIT 4);
SELECT p.city, max(p.age), length(group_concat(p.name)) FROM person p
	WHERE p.id IN (SELECT id FROM person WHERE age < 10) GROUP BY p.city ORDER BY 1 LIMIT 3;
PRAGMA integrity_check;
VACUUM;
SELECT count(*) FROM person;
