// Package wire holds the bodies, answers, error codes, routes and limits of
// the nodelane worker protocol (docs/PROTOCOL.md), shared by the server
// (package workerapi) and the Go worker client (package client).
//
// It imports nothing of nodelane but the receipt types that travel on the
// wire, so a program that only speaks the protocol links no server code.
// Times are RFC 3339 in UTC with at most microsecond precision.
package wire
