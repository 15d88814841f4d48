package data

import "github.com/hpcrun/hpcrun/train/internal/traintest"

// The tests' shared model, text and NumPy (package traintest).
var (
	smallConfig = traintest.SmallConfig
	textFile    = traintest.TextFile
	numpyPython = traintest.NumpyPython
)
