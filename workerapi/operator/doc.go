// Package operator is the Go client of nodelane's operator routes
// (docs/PROTOCOL.md §13): jobs, artifacts, workers, credentials and
// principals, the envelope, costs and the receipt log, each route one
// typed method of [Client], and every list route also an iterator that
// follows the API's cursor (next → after) page after page.
//
// Operator routes carry a bearer credential and no signature. A Client
// holds one token; [Client.WithToken] returns a cheap copy that sends
// another, for a program that acts for several operators (the console
// signs each request with its signed-in operator's token).
//
// A Client speaks HTTP through an *http.Client, its own or the caller's
// ([Config].HTTPClient). To call an operator handler in the same process
// (workerapi's Server.OperatorHandler) without a listener, give it a
// [HandlerTransport]:
//
//	api, err := operator.New("http://nodelane.internal", token, &operator.Config{
//		HTTPClient: &http.Client{Transport: &operator.HandlerTransport{Handler: srv.OperatorHandler()}},
//	})
//
// An error answer of the API is a *[wire.Error] (read it with errors.As,
// or wire.IsCode); an answer that is not what the route answers (not JSON,
// the wrong shape, too large) wraps [ErrMalformedAnswer]; a request that
// got no answer wraps the transport's error. No error holds a token.
//
// The package links no server code: of nodelane it imports workerapi/wire
// and receipts only, so an operator tool built on it links no store, core
// state machine or database driver.
package operator
