// Package tests holds the end-to-end suites of the whole system.
package tests
