package plan

import "fmt"

// Predict plans r (New) and, when the run does not fit, says what would
// (Suggest). vocabKnown false says r.Vocab is only the most a WordPiece
// vocabulary built from the data can hold (the data was not read): the
// plan notes it.
func Predict(r Request, vocabKnown bool) (*Plan, []Suggestion, error) {
	pl, err := New(r)
	if err != nil {
		return nil, nil, err
	}
	if !vocabKnown {
		pl.Notes = append(pl.Notes, fmt.Sprintf("vocab: at most %d, the WordPiece vocabulary built from the data at the start (plan does not read the data; submit --dry-run does)", r.Vocab))
	}
	var sug []Suggestion
	if !pl.Fits {
		sug = Suggest(r)
	}
	return pl, sug, nil
}
