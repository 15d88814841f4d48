package main

import "fmt"

// nOf is n and the noun, plural unless n is 1: "1 task", "4 tasks".
func nOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// cores2 is a number of cores to two digits: "1 core", "0.5 core", "8 cores".
func cores2(n float64) string {
	if n <= 1 {
		return fmt.Sprintf("%.2g core", n)
	}
	return fmt.Sprintf("%.2g cores", n)
}
