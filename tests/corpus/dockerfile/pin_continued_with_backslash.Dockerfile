# expect: line=4 value=continued onto line 5
FROM python:3.12-slim
WORKDIR /app
ENV HARBOR_COMMIT=\
    aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
RUN uv pip install --force-reinstall "harbor @ git+https://github.com/marin-community/harbor.git@${HARBOR_COMMIT}"
