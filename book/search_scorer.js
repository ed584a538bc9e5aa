/*
 * The book's search ranking (html_search_scorer in _config.yml). Sphinx's default
 * weights, plus one rule: the generated pages of tests/ (book/checks/) come after the
 * chapters, so that searching "YaRN" lists chapter 11 before the test files that check it.
 * The evidence pages are still found; they are only ranked last.
 */
var Scorer = {
  score: (result) => {
    const [docname, , , , score] = result;
    return docname.startsWith("book/checks/") ? score - 1000 : score;
  },
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: { 0: 15, 1: 5, 2: -5 },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
