//! The baseline of the cold-start benchmark: the smallest `lambda_http`
//! function, built like ours, answering a fixed JSON body.

use lambda_http::{Body, Error, Request, Response, service_fn};

async fn hello(_req: Request) -> Result<Response<Body>, Error> {
    Ok(Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"hello":"world"}"#))?)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::run(service_fn(hello)).await
}
