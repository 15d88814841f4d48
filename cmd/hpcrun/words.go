package main

import "fmt"

// nOf is n and the noun, plural unless n is 1: "1 task", "4 tasks".
func nOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
