DROP TABLE IF EXISTS nodelane_answers;
