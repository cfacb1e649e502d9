"""A small hand-labelled set for C03 (reference-shaped prose without an identifier): True = really such prose.

The gate stage measures C03's false-positive cost on it every run (``citations.c03_false_positive_cost``) and
reports it next to the C03 rate, so a reader knows how much of a C03 count may be false alarm (hand count:
10 positives, 10 caught; 13 negatives, 2 false alarms: precision 10/12). tests/test_gates_citations.py holds the hand
count on this same set. C03's figures on 410 real answers (AlpacaEval, Arena-Hard), tuned-on and held-out, are
measured by benchmarks/citations.py.
"""

C03_LABELLED: tuple[tuple[str, bool], ...] = (
    ("According to a 2019 study, people who drink coffee live longer.", True),
    ("A recent study found that remote workers are more productive.", True),
    ("Studies have shown that bilingual children score higher on tests.", True),
    ("This effect is well documented (Smith et al., 2020).", True),
    ("Johnson et al. (2018) reported a 30% reduction in symptoms.", True),
    ("Research suggests that sleep improves memory consolidation.", True),
    ("A 2021 survey of 5,000 adults showed rising anxiety.", True),
    ("Experts agree that the treatment is safe.", True),
    ("It was published in the New England Journal of Medicine last year.", True),
    ("Harvard researchers believe the drug works.", True),
    ("According to the documentation [doc:api-7], the limit is 100 requests.", False),  # has an id
    ("A 2019 study (https://doi.org/10.1000/xyz) found no effect.", False),  # has a DOI link
    ("Python 3.11 was released in 2022.", False),
    ("I can help you study for your exam in 2024.", False),
    ("The survey results are in the attached spreadsheet.", False),
    ("Install it with pip (Python, 2023) and run the tests.", False),  # false alarm: looks like (Author, year)
    ("The report card shows that she improved in math.", False),
    ("A new report shows the build failed on Windows.", False),  # false alarm: a CI report, not a source
    ("Our experiments show the cache halves latency (see the table below).", False),  # the writer's own work
    ("The data shows three missing values in column B.", False),
    ("The evidence shows the password was changed yesterday (see the audit log).", False),  # "the evidence": the user's
    ("He was born in 1990 and moved to Paris.", False),
    ("Many papers on this topic were written before 2000.", False),
)
